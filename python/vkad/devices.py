"""The Vulkan devices vkad can run on, and which CUDA device each one is.

vkad is a per-device backend: a program that spreads a batch over several GPUs opens one
vkad.Session per device (vkad.Session(device=d.index) or device=d.uuid), each on its own thread
or, with torch.distributed, in its own process. devices() lists them with their UUIDs; on NVIDIA
the Vulkan device UUID is the CUDA device's, so a process that also runs CUDA (PyTorch, NCCL)
finds the Vulkan device of its CUDA ordinal with device_for_cuda(ordinal), whatever order each
API enumerates in and whatever CUDA_VISIBLE_DEVICES hides.
"""
from __future__ import annotations

import ctypes
import dataclasses
import sys
from typing import List, Optional

from . import _vkad
from .errors import NotFoundError


@dataclasses.dataclass(frozen=True)
class Device:
    """One Vulkan device (vkad::DeviceInfo, api/devices.h)."""
    index: int            # what Session(device=...) and VKAD_DEVICE take as a number
    name: str
    kind: str             # "discrete GPU", "integrated GPU", "virtual GPU", "CPU" or "other"
    cpu: bool             # a CPU implementation (lavapipe), no GPU behind it
    uuid: str             # "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; Session(device=uuid) takes it
    driver_name: str
    driver_info: str      # the driver's version text
    vendor_id: int
    device_id: int
    api_version: str
    usable: bool          # a Session can be created on it; else `unusable` says why
    unusable: str
    automatic: bool       # what Session() without a device takes (VKAD_DEVICE counted)
    cuda_ordinal: Optional[int]  # the CUDA device with the same UUID in this process, if any


def normalize_uuid(uuid: object) -> Optional[str]:
    """A UUID in vkad's form ("xxxxxxxx-xxxx-...", lower case) from 16 bytes, a hex string with
    or without dashes, or nvidia-smi's "GPU-..." form; None if it is none of these."""
    if isinstance(uuid, (bytes, bytearray)):
        digits = bytes(uuid).hex() if len(uuid) == 16 else ""
    else:
        text = str(uuid).strip()
        if text.lower().startswith("gpu-"):
            text = text[4:]
        digits = text.replace("-", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def _cuda_uuids_from_libcuda() -> Optional[List[str]]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    out = []
    for ordinal in range(count.value):
        dev = ctypes.c_int(0)
        raw = (ctypes.c_ubyte * 16)()
        if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0 or \
                cuda.cuDeviceGetUuid(raw, dev) != 0:
            return None
        out.append(normalize_uuid(bytes(raw)))
    return out


def _cuda_uuids_from_torch() -> Optional[List[str]]:
    torch = sys.modules.get("torch")  # only a torch the program imported: importing it is slow
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        return [normalize_uuid(torch.cuda.get_device_properties(i).uuid)
                for i in range(torch.cuda.device_count())]
    except Exception:  # an older torch without .uuid, or a CUDA error: no matching then
        return None


def cuda_uuids() -> List[str]:
    """The UUIDs of the CUDA devices this process sees, indexed by CUDA ordinal (after
    CUDA_VISIBLE_DEVICES); [] without an NVIDIA driver. Asks the CUDA driver (libcuda, through
    ctypes: no CUDA toolkit needed), else an already imported torch. Initialises the CUDA driver
    in this process (cuInit), as torch.cuda would: do it after forking worker processes, not
    before."""
    for source in (_cuda_uuids_from_libcuda, _cuda_uuids_from_torch):
        uuids = source()
        if uuids is not None and all(u is not None for u in uuids):
            return uuids
    return []


def devices(cuda: bool = True) -> List[Device]:
    """Every Vulkan device, usable or not, in the order of the indices Session(device=) takes.
    cuda=True fills Device.cuda_ordinal by matching UUIDs with cuda_uuids() (None where no CUDA
    device matches, as for lavapipe); cuda=False leaves CUDA alone."""
    by_uuid = {u: i for i, u in enumerate(cuda_uuids())} if cuda else {}
    return [Device(**d, cuda_ordinal=by_uuid.get(d["uuid"])) for d in _vkad._devices()]


def device_for_cuda(ordinal: int) -> Device:
    """The Vulkan device that is CUDA device `ordinal` of this process (same UUID), for a rank
    that holds CUDA device `ordinal` (torch.cuda.set_device, NCCL) and runs vkad beside it.
    NotFoundError naming what exists when there is no such CUDA device or no Vulkan device
    with its UUID."""
    uuids = cuda_uuids()
    if not 0 <= ordinal < len(uuids):
        raise NotFoundError(f"CUDA device {ordinal}: this process sees {len(uuids)} CUDA "
                            "device(s) (CUDA_VISIBLE_DEVICES, driver)")
    listed = devices(cuda=False)
    for d in listed:
        if d.uuid == uuids[ordinal]:
            return dataclasses.replace(d, cuda_ordinal=ordinal)
    present = ", ".join(f"{d.index}: {d.name} {d.uuid}" for d in listed) or "none"
    raise NotFoundError(f"CUDA device {ordinal} (UUID {uuids[ordinal]}) is not a Vulkan device "
                        f"here; Vulkan devices: {present}")
