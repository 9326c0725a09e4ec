import pytest

from steno.services.dialects import InvalidInput
from steno.services.dialects.tools import apply_tool_choice, tool_catalog

SEARCH = {"type": "function", "name": "search", "description": "Search the web"}
CRM = {"type": "namespace", "name": "crm", "description": "The CRM",
       "tools": [{"type": "function", "name": "search", "description": "Search customers"},
                 {"type": "function", "name": "find_user", "description": "One customer"}]}
DOCS = {"type": "namespace", "name": "docs", "tools": [{"type": "function", "name": "search"}]}


def test_a_top_level_tool_wins_its_bare_name_over_a_namespaced_one():
    for tools in ([SEARCH, CRM], [CRM, SEARCH]):
        catalog = tool_catalog(tools)
        assert catalog.qualified("search", None) == "search"
        assert catalog.qualified("search", "crm") == "crm.search"


def test_a_bare_name_only_one_namespace_has_means_that_tool():
    assert tool_catalog([SEARCH, CRM]).qualified("find_user", None) == "crm.find_user"


def test_an_ambiguous_bare_name_is_kept_as_received():
    assert tool_catalog([CRM, DOCS]).qualified("search", None) == "search"


def test_tool_choice_by_bare_name_offers_the_top_level_tool():
    offered, instruction = apply_tool_choice(tool_catalog([SEARCH, CRM]), {"type": "function", "name": "search"})
    assert list(offered.functions) == ["search"]
    assert instruction == "You must call the tool `search`."


def test_tool_choice_with_a_namespace_offers_the_namespaced_tool():
    choice = {"type": "function", "name": "search", "namespace": "crm"}
    offered, _ = apply_tool_choice(tool_catalog([SEARCH, CRM]), choice)
    assert list(offered.functions) == ["crm.search"]


def test_tool_choice_by_an_ambiguous_bare_name_is_refused_naming_the_candidates():
    with pytest.raises(InvalidInput) as refused:
        apply_tool_choice(tool_catalog([CRM, DOCS]), {"type": "function", "name": "search"})
    assert refused.value.param == "tool_choice.name"
    assert "crm.search" in str(refused.value) and "docs.search" in str(refused.value)


def test_allowed_tools_resolve_names_the_same_way():
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "search"}, {"type": "function", "name": "find_user"}]}
    offered, instruction = apply_tool_choice(tool_catalog([SEARCH, CRM]), choice)
    assert sorted(offered.functions) == ["crm.find_user", "search"]
    assert instruction is not None


def test_an_allowed_tool_that_is_not_an_object_is_a_clear_error():
    with pytest.raises(InvalidInput) as refused:
        apply_tool_choice(tool_catalog([SEARCH]), {"type": "allowed_tools", "tools": ["search"]})
    assert refused.value.param == "tool_choice.tools[0]"
