"""torch's out-of-memory message (CUDA, HIP, XPU; its current and its pre-2.1 wording): what it says about the
device, this process and the others, whichever engine raised it."""

from __future__ import annotations

import re

from kvops.frozen import frozen

_SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# a size where a number starts (the lookbehind): searched along a line, a run of digits is tried once, not at each of
# its digits (which made a 1 MB line of digits quadratic); one decimal point at most, so size_bytes always parses
_SIZE = r"(?<![\d.])(\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB))"
TORCH_OOM = re.compile(r"(CUDA|HIP|XPU) out of memory\. Tried to allocate " + _SIZE)
_TORCH_OOM_DEVICE = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_TORCH_OOM_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_TORCH_OOM_SELF = re.compile(r"this process has " + _SIZE + r" memory in use")
_TORCH_OOM_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_TORCH_OOM_POOLS = re.compile(r"with " + _SIZE + r" allocated in private pools")
_TORCH_OOM_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_TORCH_OOM_OLD = re.compile(
    r"\(GPU (\d+); "
    + _SIZE
    + r" total capacity; "
    + _SIZE
    + r" already allocated; "
    + _SIZE
    + r" free; "
    + _SIZE
    + r" reserved in total by PyTorch\)"
)


def size_bytes(text: str) -> int:
    """torch's '1.74 GiB' / '448.00 KiB' as bytes (binary units; two decimals, so +-0.5% of the unit)."""
    number, unit = text.split()
    return round(float(number) * _SIZE_UNITS[unit])


@frozen
class OutOfMemory:
    """The figures of one torch out-of-memory message (per device, at the moment of the failed allocation)."""

    backend: str  # CUDA, HIP, XPU
    tried_bytes: int
    device: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    process_bytes: int | None = None  # "this process has X memory in use" (with non-PyTorch memory)
    other_processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes) of "Process N has X memory in use"
    allocated_bytes: int | None = None  # by PyTorch, live tensors
    private_pool_bytes: int | None = None  # PyTorch private pools: CUDA graphs
    unallocated_bytes: int | None = None  # reserved by PyTorch but unallocated (fragmentation)

    @property
    def shortfall_bytes(self) -> int | None:
        return self.tried_bytes - self.free_bytes if self.free_bytes is not None else None


def out_of_memory(line: str) -> OutOfMemory | None:
    """The figures of torch's out-of-memory message on this line, in its current or its pre-2.1 wording."""
    match = TORCH_OOM.search(line)
    if not match:
        return None
    backend, tried = match.group(1), size_bytes(match.group(2))
    if old := _TORCH_OOM_OLD.search(line):
        total, allocated, free, reserved = (size_bytes(old.group(i)) for i in range(2, 6))
        return OutOfMemory(
            backend,
            tried,
            int(old.group(1)),
            total,
            free,
            allocated_bytes=allocated,
            unallocated_bytes=reserved - allocated,
        )
    device = _TORCH_OOM_DEVICE.search(line)

    def size(pattern: re.Pattern) -> int | None:
        found = pattern.search(line)
        return size_bytes(found.group(1)) if found else None

    return OutOfMemory(
        backend,
        tried,
        device=int(device.group(1)) if device else None,
        total_bytes=size_bytes(device.group(2)) if device else None,
        free_bytes=size_bytes(device.group(3)) if device else None,
        process_bytes=size(_TORCH_OOM_SELF),
        other_processes=tuple((int(pid), size_bytes(amount)) for pid, amount in _TORCH_OOM_OTHER.findall(line)),
        allocated_bytes=size(_TORCH_OOM_ALLOCATED),
        private_pool_bytes=size(_TORCH_OOM_POOLS),
        unallocated_bytes=size(_TORCH_OOM_UNALLOCATED),
    )
