"""`nvidia-smi` output as devices with their memory used and total, read from the two forms operators paste.

- the default table: a device row `|   0  NVIDIA GeForce RTX 4090   On  | 00000000:1E:00.0 Off |  Off |` followed by
  the row with its memory `| 30%   26C  P8  16W / 450W |  14214MiB / 24564MiB |  0%  Default |` (driver 450 to
  570 layouts; MIG rows and the process table are not device rows);
- `nvidia-smi --query-gpu=memory.total,memory.used --format=csv` (any field order, `index` and `name` too, with or
  without `noheader`/`nounits`; without a header the fields are taken as `memory.total, memory.used`).
nvidia-smi prints MiB (binary): every figure here is an exact number of MiB. Pure: text in, devices out.
"""

from __future__ import annotations

import re

from kvops.errors import KvopsError
from kvops.frozen import frozen

MiB = 1 << 20
_MEMORY_CELL = re.compile(r"\|\s*(\d{1,12})MiB\s*/\s*(\d{1,12})MiB\s*\|")  # 12 digits of MiB: past any device
_CSV_FIELD = re.compile(r"^\s*([a-z_.]+)(?:\s*\[([^\]]+)\])?\s*$")


@frozen
class SmiDevice:
    index: int
    used_bytes: int
    total_bytes: int
    name: str | None = None

    def describe(self) -> str:
        name = f" ({self.name})" if self.name else ""
        return f"GPU {self.index}{name}: {self.used_bytes // MiB} MiB / {self.total_bytes // MiB} MiB"


def parse_nvidia_smi(text: str, where: str = "nvidia-smi output") -> list[SmiDevice]:
    """Devices in nvidia-smi's table or CSV output; KvopsError naming the file when there are none."""
    text = "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    )  # nvidia-smi prints no '#'
    devices = _table(text) or _csv(text, where)
    if not devices:
        raise KvopsError(
            f"{where}: no GPU memory found; give `nvidia-smi` output or `nvidia-smi --query-gpu=memory.total,memory.used --format=csv`"
        )
    for device in devices:
        if device.total_bytes <= 0 or device.used_bytes > device.total_bytes:
            raise KvopsError(
                f"{where}: {device.describe()}: more used than the device holds; paste the output as nvidia-smi printed it"
            )
    return devices


def _table(text: str) -> list[SmiDevice]:
    devices: list[SmiDevice] = []
    pending: tuple[int, str] | None = None
    for line in text.splitlines():
        if "Processes:" in line or "MIG devices:" in line:
            break
        row = _device_row(line)
        if row:
            pending = row
            continue
        memory = _MEMORY_CELL.search(line)
        if memory and pending:
            index, name = pending
            devices.append(SmiDevice(index, int(memory.group(1)) * MiB, int(memory.group(2)) * MiB, name))
            pending = None
    return devices


def _device_row(line: str) -> tuple[int, str] | None:
    """`|   0  NVIDIA GeForce RTX 4090   On  | ...`: the index and name of the device in the row's first cell (read
    by words, not a regex: a hostile line of blanks cannot make it backtrack)."""
    cells = line.strip().split("|")
    if len(cells) < 3 or cells[0] or not cells[1][:1].isspace():
        return None
    words = cells[1].split()
    if len(words) < 3 or words[-1] not in ("On", "Off") or not _small_number(words[0]):
        return None
    return int(words[0]), " ".join(words[1:-1])


def _small_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 6


def _csv(text: str, where: str) -> list[SmiDevice]:
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    if not rows:
        return []
    fields = ["memory.total", "memory.used"]
    if not _is_value(rows[0][0]):
        header = [match for cell in rows[0] if (match := _CSV_FIELD.match(cell))]
        if len(header) != len(rows[0]):
            return []
        fields = [match.group(1) for match in header]
        rows = rows[1:]
    if "memory.total" not in fields or "memory.used" not in fields:
        return []
    devices = []
    for number, row in enumerate(rows):
        if len(row) != len(fields):
            raise KvopsError(
                f"{where}: line {number + 1} has {len(row)} fields, the header {len(fields)} ({', '.join(fields)})"
            )
        record = dict(zip(fields, row))
        index = int(record["index"]) if _small_number(record.get("index", "")) else number
        devices.append(
            SmiDevice(
                index, _mib(record["memory.used"], where), _mib(record["memory.total"], where), record.get("name")
            )
        )
    return devices


def _is_value(cell: str) -> bool:
    return bool(re.match(r"^\d", cell))


def _mib(cell: str, where: str) -> int:
    match = re.fullmatch(r"(\d{1,12})(?:\s*MiB)?", cell)
    if not match:
        raise KvopsError(f"{where}: {cell!r} is not a memory figure in MiB (nvidia-smi prints e.g. '24564 MiB')")
    return int(match.group(1)) * MiB
