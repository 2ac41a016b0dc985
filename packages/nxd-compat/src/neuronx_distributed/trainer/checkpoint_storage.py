# ruff: noqa: UP006, UP007, UP035 - vendored with NxD's typing style
"""``neuronx_distributed.trainer.checkpoint_storage``: NxD's checkpoint storage classes.

``BaseCheckpointStorage`` and ``FilesysCheckpointStorage`` are vendored from aws-neuron/
neuronx-distributed (Apache-2.0), ``src/neuronx_distributed/trainer/checkpoint_storage.py`` at
commit fbac349 (Release 2.29); changed: ``xm.rendezvous`` is ``torch.distributed.barrier``.
NxD's ``S3CheckpointStorage`` (boto3, s3transfer, CRT) is not provided: it raises, naming nxd's
S3 support (``save_checkpoint``/``load_checkpoint`` take ``s3://`` URLs through nxd-ckpt).
"""

import glob
import os
import shutil
from abc import abstractmethod
from typing import Any, Dict, List, Optional

import torch

from neuronx_distributed.utils.logger import get_logger
from nxd_compat.surface import not_provided

__all__ = ["BaseCheckpointStorage", "FilesysCheckpointStorage", "S3CheckpointStorage", "create_checkpoint_storage"]

logger = get_logger()
# bytes in MB
MB = 1024**2
# glibc linux system expects POSIX shared memory to be mounted at /dev/shm
SHM_PATH = "/dev/shm"
_S3 = ("NxD's S3 retry helper (boto3/CRT) is not provided; save_checkpoint / load_checkpoint accept s3:// paths "
       "through nxd-ckpt (fsspec/s3fs, which retries)")
__getattr__ = not_provided(__name__, {"wait_decrementing_with_jitter": _S3, "is_slow_down_error": _S3})


class BaseCheckpointStorage:
    def __init__(self, dirname: str):
        self._dirname = dirname

    def dirname(self) -> str:
        return self._dirname

    def is_checkpoint_xser(self, dirname: str) -> bool:
        dirs = self.find_subdirs_contain_path(
            pattern="*.tensors", search_depth=2, search_root=dirname, max_count=1, sort_by_mdate=False
        )
        return len(dirs) > 0

    def list_checkpoint_tags(self) -> List[str]:
        return self.find_subdirs_contain_path(pattern="checkpoint", search_depth=1, sort_by_mdate=True)

    def list_completed_checkpoint_tags(self) -> List[str]:
        return self.find_subdirs_contain_path(pattern="done", search_depth=1, sort_by_mdate=True)

    def find_subdirs_contain_path(
        self,
        pattern: str,
        search_depth: int,
        search_root: Optional[str] = None,
        max_count: Optional[int] = None,
        sort_by_mdate: bool = False,
    ) -> List[str]:
        files = self.find_files(pattern, search_depth + 1, search_root, max_count, sort_by_mdate)
        subdirs = []
        for file in files:
            subdirs.append(os.path.dirname(file))
        return subdirs

    @abstractmethod
    def dir_exists(self, dirname: str) -> bool:
        raise NotImplementedError

    @abstractmethod
    def file_exists(self, filename: str) -> bool:
        raise NotImplementedError

    @abstractmethod
    def find_files(
        self,
        pattern: str,
        search_depth: int,
        search_root: Optional[str] = None,
        max_count: Optional[int] = None,
        sort_by_mdate: bool = False,
    ):
        raise NotImplementedError

    @abstractmethod
    def save_text(self, text: str, filename: str) -> None:
        raise NotImplementedError

    @abstractmethod
    def save_object(self, obj: object, filename: str) -> None:
        raise NotImplementedError

    @abstractmethod
    def load_object(self, filename: str, map_location: torch.serialization.MAP_LOCATION = None) -> Any:
        raise NotImplementedError

    @abstractmethod
    def create_dir(self, dirname: str, exist_ok: bool = True) -> None:
        raise NotImplementedError

    @abstractmethod
    def create_shared_dir(
        self, dirname: str, exist_ok: bool = True, process_group: Optional[torch.distributed.ProcessGroup] = None
    ) -> None:
        raise NotImplementedError

    @abstractmethod
    def remove_dir(self, dirname: str) -> None:
        raise NotImplementedError

    @abstractmethod
    def remove_file(self, filename: str) -> None:
        raise NotImplementedError

    def remove_dirs(self, dirnames: List[str]) -> None:
        for dirname in dirnames:
            self.remove_dir(dirname)

    def remove_files(self, filenames: List[str]) -> None:
        for filename in filenames:
            if self.file_exists(filename):
                self.remove_file(filename)


class FilesysCheckpointStorage(BaseCheckpointStorage):
    def __init__(self, dirname: str):
        super().__init__(dirname)

    def dir_exists(self, dirname: str) -> bool:
        dirname = os.path.join(self._dirname, dirname)
        return os.path.exists(dirname) and os.path.isdir(dirname)

    def file_exists(self, filename: str) -> bool:
        filename = os.path.join(self._dirname, filename)
        return os.path.exists(filename) and os.path.isfile(filename)

    def is_checkpoint_xser(self, ckpt_path: str) -> bool:
        ckpt_path = os.path.join(self._dirname, ckpt_path)
        for x in os.listdir(ckpt_path):
            inner_path = os.path.join(ckpt_path, x)
            if os.path.isdir(inner_path):
                for y in os.listdir(inner_path):
                    if y.endswith(".tensors"):
                        return True
        return False

    def find_files(
        self,
        pattern: str,
        search_depth: int,
        search_root: Optional[str] = None,
        max_count: Optional[int] = None,
        sort_by_mdate: bool = False,
    ) -> List[str]:
        if not os.path.exists(self._dirname):
            return []

        if search_root:
            pattern = f"{self._dirname}/{search_root}/**/{pattern}"
        else:
            pattern = f"{self._dirname}/**/{pattern}"

        paths = glob.glob(pattern)
        if sort_by_mdate:
            paths.sort(key=os.path.getmtime)

        if isinstance(max_count, int) and max_count > 0 and len(paths) > max_count:
            paths = paths[0:max_count]

        files = []
        for path in paths:
            files.append(os.path.relpath(path, self._dirname))
        return files

    def save_text(self, text: str, filename: str) -> None:
        filename = os.path.join(self._dirname, filename)
        with open(filename, "w") as f:
            f.write(text)

    def save_object(self, obj: Any, filename: str) -> None:
        filename = os.path.join(self._dirname, filename)
        torch.save(obj, filename)

    def load_object(self, filename: str, map_location: torch.serialization.MAP_LOCATION = None) -> Any:
        filename = os.path.join(self._dirname, filename)
        return torch.load(filename, map_location=map_location, weights_only=False)

    def remove_dir(self, dirname: str) -> None:
        dirname = os.path.join(self._dirname, dirname)
        if os.path.exists(dirname):
            shutil.rmtree(dirname)

    def remove_file(self, filename: str) -> None:
        filename = os.path.join(self._dirname, filename)
        if os.path.exists(filename):
            os.unlink(filename)

    def create_dir(self, dirname: str, exist_ok: bool = True) -> None:
        dirname = os.path.join(self._dirname, dirname)
        os.makedirs(dirname, exist_ok=exist_ok)

    def create_shared_dir(
        self, dirname: str, exist_ok: bool = True, process_group: Optional[torch.distributed.ProcessGroup] = None
    ) -> None:
        if process_group is None:
            return self.create_dir(dirname, exist_ok)

        if exist_ok:
            # let all processes in the group to create directory,
            # the first one wins. The losers may throw an exception
            # about directory already exist, which we ignore.
            try:
                self.create_dir(dirname, exist_ok=True)
            except OSError:
                pass
        else:
            if process_group.rank() == 0:
                self.create_dir(dirname, exist_ok)
            # TODO: use torch.distributed_barrier(group=process_group)
            # once xla backend support barrier
            torch.distributed.barrier(group=process_group)



class S3CheckpointStorage(BaseCheckpointStorage):
    S3_PATH_PREFIX = "s3://"

    def __init__(self, dirname: str, crt_config: Optional[Dict] = None) -> None:
        raise NotImplementedError(
            f"{dirname}: NxD's S3CheckpointStorage (boto3/s3transfer) is not provided by nxd-compat; "
            "neuronx_distributed.save_checkpoint / load_checkpoint accept s3:// paths through nxd-ckpt (fsspec/s3fs)")


def create_checkpoint_storage(dirname: str, crt_config: Optional[Dict] = None) -> BaseCheckpointStorage:
    if dirname.startswith(S3CheckpointStorage.S3_PATH_PREFIX):
        return S3CheckpointStorage(dirname, crt_config)
    return FilesysCheckpointStorage(dirname)
