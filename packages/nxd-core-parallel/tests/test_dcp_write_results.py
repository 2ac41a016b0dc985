"""The per-rank ``write_results.tmp.<rank>`` files of NxD's ZeRO-1 DCP save are read with DCP's classes
only: DCP's own ``WriteResult`` lists come back equal; a pickle that would run code, or holds
something else, is refused naming the file."""

import os
import pickle

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from nxd_core_parallel.dcp_metadata import DcpMetadataError, load_dcp_write_results


def _results() -> list[WriteResult]:
    return [WriteResult(index=MetadataIndex("optim.state.0.exp_avg", torch.Size([0, 0]), 0), size_in_bytes=96,
                        storage_data=_StorageInfo(relative_path="__0_0.distcp", offset=0, length=96))]


def test_write_results_round_trip():
    assert load_dcp_write_results(pickle.dumps(_results()), "write_results.tmp.0") == _results()


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo owned",))


@pytest.mark.parametrize("payload, said", [
    (pickle.dumps([_RunsCode()]), "posix.system"),
    (pickle.dumps({"not": "a list"}), "it holds dict"),
    (b"\x80\x04truncated", "not a DCP write-results file"),
])
def test_hostile_or_damaged_write_results_named(payload, said):
    with pytest.raises(DcpMetadataError) as err:
        load_dcp_write_results(payload, "/run/tag/optim/write_results.tmp.1")
    message = str(err.value)
    assert message.startswith("/run/tag/optim/write_results.tmp.1: ") and said in message, message
    assert "weights_only" not in message
