"""Importing the plugin and litellm makes no network call (litellm's cost map is local).

A fresh interpreter records every socket audit event (connect, DNS lookups) while it
imports the plugin, then litellm, asks litellm for a price and waits long enough for
litellm's background cost-map fetch to have fired (it retries after 2.2 s when it is
allowed to go online).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    events = []
    NETWORK_EVENTS = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                      "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.sendto",
                      "socket.sendmsg"}
    def hook(name, args):
        # Contacting anything: connections, name lookups, datagrams (a bind to ::1 to
        # probe for IPv6 support, as urllib3 does at import, reaches nothing).
        if name in NETWORK_EVENTS:
            events.append([name, repr(args)[:200]])
    sys.addaudithook(hook)
    import pytest_automedbench.plugin
    plugin_pulled_litellm = "litellm" in sys.modules
    import litellm
    litellm.suppress_debug_info = True
    price = litellm.cost_per_token(model="gpt-4o", prompt_tokens=1000, completion_tokens=500)
    time.sleep(3.0)
    print(json.dumps({"events": events, "price": price,
                      "plugin_pulled_litellm": plugin_pulled_litellm}))
    """
)


def test_plugin_and_litellm_import_without_network() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["events"] == [], report["events"]
    assert report["plugin_pulled_litellm"] is False  # litellm loads only for model agents
    cost_in, cost_out = report["price"]
    assert cost_in > 0 and cost_out > 0  # the bundled cost map answered


@pytest.mark.slow
def test_without_the_setting_litellm_would_go_online() -> None:
    """The check above can fail: without the plugin's setting, importing litellm tries
    to fetch its cost map (a DNS lookup is the first socket event)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM")}
    script = SCRIPT.replace("import pytest_automedbench.plugin\n", "")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any("getaddrinfo" in name or "connect" in name for name, _ in report["events"])
