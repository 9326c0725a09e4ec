import pytest

from steno.services.dialects import Grammar, InvalidInput
from steno.services.dialects.tools import apply_tool_choice, grammar_in
from steno.services.dialects.tools import tool_catalog as catalog_of


def tool_catalog(tools):
    return catalog_of((f"tools[{index}]", tool) for index, tool in enumerate(tools))

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


def test_built_in_tools_are_accepted_but_not_offered():
    built_ins = [{"type": kind} for kind in ("web_search", "web_search_preview", "code_interpreter", "file_search",
                                             "image_generation", "mcp", "computer_use_preview",
                                             "programmatic_tool_calling")]
    catalog = tool_catalog([*built_ins, SEARCH])
    assert list(catalog.functions) == ["search"]
    with pytest.raises(InvalidInput) as refused:
        apply_tool_choice(catalog, {"type": "web_search"})
    assert refused.value.param == "tool_choice.type"
    with pytest.raises(InvalidInput):
        apply_tool_choice(tool_catalog(built_ins), "required")
    allowed = [{"type": "web_search"}, {"type": "function", "name": "search"}]
    offered, _ = apply_tool_choice(catalog, {"type": "allowed_tools", "tools": allowed})
    assert list(offered.functions) == ["search"]


def test_a_client_tool_search_is_offered_as_a_function_and_a_server_one_is_not():
    client = tool_catalog([{"type": "tool_search", "execution": "client", "description": "Find tools."}])
    assert list(client.functions) == ["tool_search"] and client.tool_search
    assert client.functions["tool_search"].description == "Find tools."
    assert client.parse_context("harmony", 1).tool_search
    assert tool_catalog([{"type": "tool_search", "execution": "server"}]).functions == {}


def test_a_namespace_named_functions_holds_top_level_tools():
    catalog = tool_catalog([{"type": "namespace", "name": "functions", "tools": [SEARCH]}])
    assert list(catalog.functions) == ["search"] and catalog.namespaces == set()
    assert catalog.qualified("search", "functions") == "search"


def test_a_tool_declared_again_the_same_is_one_tool_and_declared_differently_is_refused():
    assert list(tool_catalog([SEARCH, dict(SEARCH)]).functions) == ["search"]
    with pytest.raises(InvalidInput) as refused:
        tool_catalog([SEARCH, {**SEARCH, "description": "Something else"}])
    assert refused.value.param == "tools[1].name"


def test_a_custom_tools_grammar_is_told_in_its_description_and_read_back():
    grammar = 'start: "a"+'
    tool = {"type": "custom", "name": "spell", "description": "Spells.",
            "format": {"type": "grammar", "syntax": "lark", "definition": grammar}}
    offered = tool_catalog([tool]).functions["spell"]
    assert offered.parameters["required"] == ["input"]
    assert grammar_in(offered.description) == Grammar("lark", grammar)
    assert grammar_in(tool_catalog([{"type": "custom", "name": "note"}]).functions["note"].description) is None


@pytest.mark.parametrize("fmt", [{"type": "grammar", "syntax": "ebnf", "definition": "x"},
                                 {"type": "grammar", "syntax": "lark"}, "lark"])
def test_a_grammar_it_cannot_tell_is_refused(fmt):
    with pytest.raises(InvalidInput) as refused:
        tool_catalog([{"type": "custom", "name": "spell", "format": fmt}])
    assert refused.value.param == "tools[0].format"


@pytest.mark.parametrize("tool", [{"type": "shell"}, {"type": "shell", "environment": {"type": "local"}},
                                  {"type": "local_shell"}, {"type": "apply_patch"}])
def test_built_in_tools_the_client_runs_are_offered_under_their_names(tool):
    catalog = tool_catalog([tool])
    assert catalog.client_tools == {tool["type"]} and list(catalog.functions) == [tool["type"]]
    assert catalog.parse_context("harmony", 0).client_tools == [tool["type"]]


def test_a_shell_in_a_hosted_container_is_not_offered_and_cannot_be_required():
    container = {"type": "shell", "environment": {"type": "container_auto"}}
    assert tool_catalog([container]).functions == {}
    with pytest.raises(InvalidInput):
        apply_tool_choice(tool_catalog([container]), {"type": "shell"})


def test_tool_choice_can_ask_for_a_client_run_built_in_tool():
    catalog = tool_catalog([SEARCH, {"type": "shell"}, {"type": "apply_patch"}])
    only, instruction = apply_tool_choice(catalog, {"type": "apply_patch"})
    assert list(only.functions) == ["apply_patch"] and only.client_tools == {"apply_patch"}
    assert instruction == "You must call the tool `apply_patch`."
    allowed, _ = apply_tool_choice(catalog, {"type": "allowed_tools", "mode": "auto",
                                             "tools": [{"type": "shell"}, {"type": "function", "name": "search"}]})
    assert sorted(allowed.functions) == ["search", "shell"] and allowed.client_tools == {"shell"}
