"""docs/optimizers.md's table of registry entries matches the registry.

The table is what a user reads to choose an optimizer; it must list exactly
the registered entries, and its state column must name every field of each
entry's state schema (the fields checkpoints hold), so an entry added or a
state field changed without its row fails here.
"""
import os
import re

import muon_cpp

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "optimizers.md")


def table_rows():
    rows = {}
    with open(DOCS, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\| `([a-z0-9_]+)` \|(.*)\|\s*$", line)
            if m:
                assert m.group(1) not in rows, "two rows for " + m.group(1)
                cells = [c.strip() for c in m.group(2).split("|")]
                assert len(cells) == 5, line
                rows[m.group(1)] = cells
    return rows


def test_one_row_per_registered_entry():
    rows = table_rows()
    assert sorted(rows) == sorted(muon_cpp.optimizer_names())


def test_state_column_names_every_schema_field():
    for name, cells in table_rows().items():
        state = cells[1]
        for field in muon_cpp.state_schema(name):
            assert "`%s`" % field["name"] in state, (name, field["name"], state)


def test_config_keys_are_fields_of_their_entry():
    # A key `<entry>_<field>` names a field that entry declares (its own or
    # one an extension adds); `…` stands for the rest.
    names = sorted(muon_cpp.optimizer_names(), key=len, reverse=True)
    for name, cells in table_rows().items():
        for key in re.findall(r"`([a-z0-9_]+)`", cells[4]):
            owner = next((n for n in names if key.startswith(n + "_")), None)
            assert owner is not None, (name, key)
            fields = [f["name"] for f in muon_cpp.option_fields(owner)]
            assert key[len(owner) + 1:] in fields, (name, key, fields)
