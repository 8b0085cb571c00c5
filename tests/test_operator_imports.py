"""What the operator's process loads at start: libraries only some services use are imported when
they are first used, not with the operator (each is resident memory in every operator)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_the_operator_loads_cryptography_only_for_a_multi_node_services_key():
    script = textwrap.dedent("""
        import sys
        from triton_operator.controller import handlers  # noqa: F401  (what `run` loads)
        print("cryptography" in sys.modules)
        from triton_operator.controller.keys import ssh_key_pair
        private, public = ssh_key_pair()
        print("cryptography" in sys.modules, private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----"),
              public.startswith("ssh-ed25519 "))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True"]
