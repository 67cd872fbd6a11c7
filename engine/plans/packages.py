"""Ahead-of-time compiled packages of the torch backend's bucketed calls (AOTInductor): found, checked, loaded.

A package is native code (a shared library in a ``.pt2`` archive) built by ``compile.aot_build`` for one torch
release, one device (a GPU architecture, or the CPU) and one set of checkpoints, for one call at one batch bucket.
The JSON manifest beside the packages records all of that, each file's sha256 and the layout of the weights it
runs on (a package holds none: the backend binds its own modules' tensors, so every bucket shares one copy). The
loader takes a package only when every field matches this process and the file hashes to the manifest's value, so
it never runs a library it was not handed on purpose; otherwise it says why and the backend keeps its torch.compile
path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.backends.base import BackendError
from engine.nesting import nested_over
from engine.networks.checkpoints import OFFICIAL_FILENAMES
from engine.plans.hash_ahead import hash_ahead, sha256_of
from engine.plans.manifest import MAX_DEPTH, file_sha256
from engine.plans.package_loader import LoadedPackage, open_package

log = logging.getLogger(__name__)

FORMAT = 2
MANIFEST_FILE = "manifest.json"
CALLS = ("lmdm_prepare", "lmdm_step", "render")
"""The calls packaged, one package per batch bucket: the LMDM window preparation and DDIM step, warp + decode."""
CHECKPOINTS_OF = {"lmdm_prepare": "lmdm", "lmdm_step": "lmdm", "render": ("warp_network", "decoder")}
MAX_MANIFEST_BYTES = 1 << 20


class StalePackages(BackendError):
    """Packages that are missing, do not fit this process or these checkpoints, or were altered: the reason says
    which."""


@dataclass(frozen=True)
class Target:
    """What a package is native code for: the torch release, the device kind and architecture, the networks' dtype."""

    torch: str
    cuda: str | None
    device: str
    """``sm_XY`` for a CUDA GPU, ``cpu`` for the CPU."""
    dtype: str

    @classmethod
    def here(cls, device: torch.device, dtype: torch.dtype) -> Target:
        """This process's target for ``device``."""
        arch = "cpu"
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            arch = f"sm_{major}{minor}"
        return cls(torch.__version__, torch.version.cuda if device.type == "cuda" else None, arch, str(dtype).removeprefix("torch."))

    def folder(self) -> str:
        """The packages' folder name under a plans directory (one per device architecture)."""
        return f"torch-aot-{self.device}"


@dataclass
class Package:
    """One call at one batch bucket: its file and sha256, and how long it took to build."""

    call: str
    batch: int
    file: str
    sha256: str
    seconds: float = 0.0
    weights: str = ""
    """sha256 of the names, shapes, dtypes and strides of the weights it runs on (``weights_digest``)."""


@dataclass
class PackageManifest:
    """Everything the packages of one folder were built from, and the packages themselves."""

    target: Target
    steps: int
    """DDIM steps of the sampler the LMDM packages were exported for (the window preparation tabulates each step)."""
    checkpoints: dict[str, str]
    """Network name -> sha256 of its checkpoint file."""
    packages: list[Package] = field(default_factory=list)
    built_at: str = ""
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str, where: Path) -> PackageManifest:
        """Parse a manifest; plain JSON only (nothing in it is run). A malformed one is a ``StalePackages``."""
        try:
            raw = json.loads(text)
        except RecursionError:
            raise StalePackages(f"{where}: nested too deep to be a package manifest: rebuild the packages") from None
        except ValueError as exc:
            raise StalePackages(f"{where}: not a package manifest (not JSON: {exc}): rebuild the packages") from exc
        if nested_over(raw, MAX_DEPTH):
            raise StalePackages(f"{where}: nested more than {MAX_DEPTH} deep, not a package manifest: rebuild them")
        try:
            if raw.get("format") != FORMAT:
                raise StalePackages(f"{where}: format {raw.get('format')!r}, this engine reads format {FORMAT}: "
                                    "rebuild the packages")
            packages = [Package(**p) for p in raw["packages"]]
            for p in packages:
                if p.call not in CALLS or not isinstance(p.batch, int) or Path(p.file).name != p.file or not p.file.endswith(".pt2"):
                    raise StalePackages(f"{where}: a package entry is not one this engine makes: {p}")
            return cls(Target(**raw["target"]), int(raw["steps"]), dict(raw["checkpoints"]), packages, str(raw.get("built_at", "")))
        except StalePackages:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StalePackages(f"{where}: not a package manifest ({type(exc).__name__}: {exc}): rebuild the "
                                "packages") from exc


def read_manifest(folder: Path) -> PackageManifest:
    """The manifest of a packages folder, or ``StalePackages`` saying why there is none to use."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise StalePackages(f"no compiled packages for {folder.name.removeprefix('torch-aot-')} in {folder.parent} "
                            "(build them: python -m compile.build_plans --aot)")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise StalePackages(f"{path}: larger than any package manifest: refused")
    return PackageManifest.from_json(path.read_text(), path)


def check_manifest(manifest: PackageManifest, target: Target, steps: int, checkpoints: Mapping[str, str], where: Path) -> None:
    """Raise ``StalePackages`` naming the first field where ``manifest`` differs from this process."""
    for name in ("torch", "cuda", "device", "dtype"):
        built, here = getattr(manifest.target, name), getattr(target, name)
        if built != here:
            raise StalePackages(f"{where}: built for {name} {built}, this process has {here}: rebuild the packages")
    if manifest.steps != steps:
        raise StalePackages(f"{where}: built for {manifest.steps} DDIM steps, this engine samples {steps}: rebuild "
                            f"with --steps {steps}")
    for name, digest in checkpoints.items():
        if manifest.checkpoints.get(name) != digest:
            raise StalePackages(f"{where}: built from another {name} checkpoint: rebuild the packages")


def weights_digest(tensors: Mapping[str, torch.Tensor], names: Iterable[str]) -> str:
    """sha256 of the layout (name, shape, dtype, strides) of the weights ``names``: a package's kernels assume it."""
    lines = (f"{n} {tuple(tensors[n].shape)} {tensors[n].dtype} {tensors[n].stride()}" for n in sorted(names))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def load_packages(
    plans: Path,
    target: Target,
    steps: int,
    checkpoint_files: Mapping[str, Path],
    weights_of: Callable[[str], Mapping[str, torch.Tensor]],
) -> dict[tuple[str, int], LoadedPackage]:
    """Every package under ``plans`` for ``target``, keyed (call, batch): checked against the manifest and
    ``checkpoint_files`` (network -> file), each file's sha256 verified before it is loaded, each bound to the weights
    ``weights_of(call)`` holds (by name, not copied) once their layout is the one it was compiled for. ``StalePackages``
    otherwise."""
    folder = Path(plans) / target.folder()
    manifest = read_manifest(folder)
    needed = {name for p in manifest.packages for name in networks_of(p.call)}
    missing = needed - set(checkpoint_files)
    if missing:
        raise StalePackages(f"{folder}: packages need the {', '.join(sorted(missing))} network(s), which this backend "
                            "did not load")
    check_manifest(manifest, target, steps, {name: sha256_of(checkpoint_files[name]) for name in sorted(needed)}, folder)
    # one map per call, not per bucket
    weights = {call: weights_of(call) for call in {p.call for p in manifest.packages}}
    loaded = {(p.call, p.batch): _load_one(folder, p, target, weights[p.call]) for p in manifest.packages}
    log.info("loaded %d compiled packages from %s", len(loaded), folder)
    return loaded


def _load_one(folder: Path, package: Package, target: Target, weights: Mapping[str, torch.Tensor]) -> LoadedPackage:
    """One package, its file checked against the manifest's sha256 before it is loaded, running on ``weights``."""
    path = folder / package.file
    if not path.is_file():
        raise StalePackages(f"{path}: named by the manifest but missing: rebuild the packages")
    started = time.perf_counter()
    if file_sha256(path) != package.sha256:
        raise StalePackages(f"{path}: its sha256 is not the manifest's (altered or replaced): refused; rebuild the "
                            "packages")
    verified = time.perf_counter()
    try:
        # Single-threaded: the runtime calls each from its one GPU loop, and the container's pool of models would
        # otherwise query CUDA events, which a CUDA-graph capture forbids.
        loaded = open_package(path, single_threaded=True, device=target.device)
    except Exception as exc:  # a library that cannot load here (another toolkit, a missing symbol) is one more reason
        raise StalePackages(f"{path}: could not be loaded ({type(exc).__name__}: {exc}): rebuild the packages") from exc
    names = loaded.get_constant_fqns()
    missing = sorted(set(names) - set(weights))
    if missing:
        raise StalePackages(f"{path}: runs on weights this backend does not hold ({', '.join(missing[:3])}): rebuild "
                            "the packages")
    if weights_digest(weights, names) != package.weights:
        raise StalePackages(f"{path}: compiled for another layout of its weights (shapes, dtypes or strides): rebuild "
                            "the packages")
    try:
        loaded.load_constants({n: weights[n] for n in names}, check_full_update=True, user_managed=True)
    except Exception as exc:  # an older torch without user-managed weights, or a device the tensors are not on
        raise StalePackages(f"{path}: could not be given its weights ({type(exc).__name__}: {exc}): rebuild the "
                            "packages") from exc
    log.debug("%s: sha256 checked in %.2f s, loaded in %.2f "
              "s", package.file, verified - started, time.perf_counter() - verified)
    return loaded


def hash_checkpoints_ahead(checkpoints: Path) -> None:
    """Start hashing, in the background, the checkpoints in ``checkpoints`` that ``load_packages`` checks packages
    against, so that the hash overlaps with loading the networks (``engine.plans.hash_ahead``)."""
    names = sorted({name for call in CALLS for name in networks_of(call)})
    hash_ahead(Path(checkpoints) / OFFICIAL_FILENAMES[name] for name in names)


def networks_of(call: str) -> tuple[str, ...]:
    """The networks whose checkpoints a package of ``call`` is compiled from."""
    names = CHECKPOINTS_OF[call]
    return (names,) if isinstance(names, str) else names
