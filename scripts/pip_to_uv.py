"""pip's configuration (pip.conf files and PIP_* variables, as `pip config list` shows them) as uv's environment
variables, one `export` a line, for scripts/install.sh: uv then installs from the indexes, find-links and
constraints pip would use."""

import shlex
import subprocess
import sys

# pip's option -> (uv's variable, how uv separates a list; None: one value)
UV = {
    "index-url": ("UV_INDEX_URL", None),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
}

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
options = {}
for line in listed.splitlines():  # global.find-links='/opt/wheels'; the environment's (:env:.) come last and win
    key, _, value = line.partition("=")
    options[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
for name, (var, sep) in UV.items():
    if name in options:
        value = options[name] if sep is None else sep.join(options[name].split())
        print(f"export {var}={shlex.quote(value)}")
print("export UV_INDEX_STRATEGY=unsafe-best-match")  # as pip: the best version from any index, not the first's
