"""Rewrite the loss table between the README's <!-- loss-table --> markers from the registry."""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loss_table import table  # noqa: E402

path = os.path.join(os.path.dirname(HERE), "README.md")
with open(path) as f:
    text = f.read()
new = re.sub(r"<!-- loss-table -->.*?<!-- /loss-table -->",
             lambda _: "<!-- loss-table -->\n" + table() + "\n<!-- /loss-table -->", text, flags=re.S)
with open(path, "w") as f:
    f.write(new)
print("README loss table updated")
