import pytest
from nats.aio.msg import Msg

from steno.services.common.continuous_pull import deliveries


@pytest.mark.parametrize("reply", [
    "$JS.ACK.NS_TOKENS.parser-0.20.12345.67890.1700000000000000000.0",
    "$JS.ACK._.ACCOUNTHASH.NS_TOKENS.parser-0.20.12345.67890.1700000000000000000.0.RANDOM",
    "$JS.ACK.hub.ACCOUNTHASH.NS_GEN.worker-m.3.7.7.1700000000000000000.12",
], ids=["without-domain", "no-domain-set", "a-domain"])
def test_deliveries_is_what_the_whole_metadata_says(reply):
    msg = Msg(None, subject="ns.tokens.0.grouped", reply=reply)
    assert deliveries(msg) == msg.metadata.num_delivered
