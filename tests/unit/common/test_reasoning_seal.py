import base64

import pytest

from steno.services.common.reasoning_keys import keys_from_setting, new_key, setting_for
from steno.services.common.reasoning_seal import ReasoningSeal, SealError, SealingKey, key_id_of

OLD, NEW = SealingKey("k1", bytes(range(32))), SealingKey("k2", bytes(range(1, 33)))
TEXT = "The user wants the weather; call get_weather. Déjà vu \u2028 and \x00."


def sealed(text=TEXT, tenant="acme", item_id="rs_1", seal=ReasoningSeal([OLD]), key_id="k1"):
    return seal.seal(text, tenant=tenant, item_id=item_id, key_id=key_id)


def test_a_sealed_text_opens_to_itself_for_its_tenant():
    blob = sealed()
    assert TEXT not in blob and ReasoningSeal([OLD]).open(blob, tenant="acme") == TEXT
    assert key_id_of(blob) == "k1"


def test_sealing_is_deterministic_per_item_and_text():
    assert sealed() == sealed()
    assert len({sealed(), sealed(item_id="rs_2"), sealed(text=TEXT + ".")}) == 3


def test_any_altered_byte_is_refused():
    raw = bytearray(base64.urlsafe_b64decode(sealed()))
    for position in range(len(raw)):
        altered = bytearray(raw)
        altered[position] ^= 0x01
        with pytest.raises(SealError):
            ReasoningSeal([OLD]).open(base64.urlsafe_b64encode(bytes(altered)).decode(), tenant="acme")


@pytest.mark.parametrize("blob", ["", "not base64!", "AAAA", base64.urlsafe_b64encode(b"\x01\x02k1").decode(),
                                  "\u00e9t\u00e9"])
def test_malformed_blobs_are_refused(blob):
    with pytest.raises(SealError):
        ReasoningSeal([OLD]).open(blob, tenant="acme")


def test_another_tenants_blob_and_a_foreign_keys_blob_are_refused():
    with pytest.raises(SealError, match="another tenant"):
        ReasoningSeal([OLD]).open(sealed(), tenant="globex")
    impostor = ReasoningSeal([SealingKey("k1", bytes(32))])
    with pytest.raises(SealError, match="does not verify"):
        impostor.open(sealed(), tenant="acme")
    with pytest.raises(SealError, match="does not hold"):
        ReasoningSeal([NEW]).open(sealed(), tenant="acme")


def test_after_a_rotation_new_blobs_use_the_new_key_and_old_ones_still_open():
    rotated = ReasoningSeal([NEW, OLD])
    assert rotated.current == "k2"
    fresh = sealed(seal=rotated, key_id=rotated.current)
    assert key_id_of(fresh) == "k2"
    assert rotated.open(sealed(), tenant="acme") == TEXT == rotated.open(fresh, tenant="acme")
    with pytest.raises(SealError):
        ReasoningSeal([NEW]).open(sealed(), tenant="acme")  # k1 retired


def test_keys_are_set_as_id_and_base64_pairs():
    key = new_key()
    assert keys_from_setting(setting_for(key)) == [key]
    assert [k.key_id for k in keys_from_setting(f"{setting_for(NEW)}, {setting_for(OLD)}")] == ["k2", "k1"]
    for bad in ["k1", "k1:%%%", "k1:" + base64.b64encode(b"short").decode(), "bad id:" + setting_for(OLD)[3:]]:
        with pytest.raises(ValueError):
            keys_from_setting(bad)
