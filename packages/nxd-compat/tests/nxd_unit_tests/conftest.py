"""NxD's unit tests vendored unchanged (VENDORED.md). The few cases that ask for a layout nxd refuses
by design run too: they must fail with nxd's refusal, so they are strict expected failures here."""

import pytest

#: test id suffix -> why nxd refuses what the case asks
REFUSED_BY_DESIGN = {
    "test_padding.py::GeneratePaddingMaskTest::test_mask_generation_48_heads_8_kv_heads_trn1":
        "the trn1 padding mask is for KV heads replicated round-robin; nxd replicates them on adjacent ranks",
    "test_padding.py::GeneratePaddingMaskTest::test_mask_generation_200_heads_8_kv_heads_trn1":
        "the trn1 padding mask is for KV heads replicated round-robin; nxd replicates them on adjacent ranks",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for suffix, why in REFUSED_BY_DESIGN.items():
            if item.nodeid.endswith(suffix):
                item.add_marker(pytest.mark.xfail(raises=ValueError, strict=True, reason=why))
