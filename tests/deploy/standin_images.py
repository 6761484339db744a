"""Local stand-ins for the base images compose.yaml and the Dockerfile name, built from Debian.

Where Docker Hub cannot be reached, ``python:3.11-slim-bookworm`` and ``postgres:16-bookworm``
are made here from Debian 12 packages: a ``debootstrap --variant=minbase`` rootfs with the
recipe's packages, its ``setup.sh`` run inside it, imported with ``docker import`` and finished
by the recipe's Dockerfile (ENV, ENTRYPOINT, CMD, STOPSIGNAL: what the official image sets). A
recipe is a directory of tests/deploy/standins/.

Each stand-in carries a label with the digest of its recipe, so a later run with the same
recipe uses it as it is and a changed recipe rebuilds it. An image of that name without the
label is someone's real image: it is used, never replaced.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.dockercli import Docker, failure
from tests.support.tools import require_tool, unavailable

RECIPES = Path(__file__).with_name("standins")
SUITE = "bookworm"
MIRROR = os.environ.get("CHASSIS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: Where debootstrap keeps the .deb files it fetched, one folder per recipe (a changed recipe
#: then downloads only what changed). Outside the checkout, so clean clones share it.
DEB_CACHE = Path(os.environ.get("CHASSIS_DEBOOTSTRAP_CACHE", "/var/cache/chassis-ci/debootstrap"))
#: Extra CA certificates of the host (a TLS-inspecting egress proxy's): copied into every
#: stand-in, or pip inside the build could not verify the package index here.
HOST_CERTIFICATES = Path("/usr/local/share/ca-certificates")
LABEL = "org.chassis-worker.standin-recipe"


@dataclass(frozen=True)
class StandIn:
    """One stand-in image: the name it takes and its recipe directory."""

    image: str
    recipe: Path

    def packages(self) -> list[str]:
        """The Debian packages debootstrap installs besides minbase."""
        return (self.recipe / "packages").read_text().split()

    def digest(self) -> str:
        """A digest of everything the image is made from (recipe, certificates, this builder)."""
        digest = hashlib.sha256()
        sources = [Path(__file__), *sorted(p for p in self.recipe.rglob("*") if p.is_file())]
        sources += host_certificates()
        for source in sources:
            digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
        digest.update(f"{SUITE}\0{self.image}".encode())
        return digest.hexdigest()


STANDINS = (
    StandIn("python:3.11-slim-bookworm", RECIPES / "python-3.11-slim-bookworm"),
    StandIn("postgres:16-bookworm", RECIPES / "postgres-16-bookworm"),
)


def host_certificates() -> list[Path]:
    """The host's extra CA certificates, in name order."""
    return sorted(HOST_CERTIFICATES.glob("*.crt")) if HOST_CERTIFICATES.is_dir() else []


def ensure_standins(docker: Docker, workdir: Path, note: Callable[[str], None]) -> None:
    """Make every base image exist: real ones are kept, missing or stale stand-ins are built
    (side by side: each is mostly debootstrap waiting on the mirror)."""
    wanted = []
    for standin in STANDINS:
        label = docker.image_label(standin.image, LABEL)
        if label == "":
            note(f"{standin.image}: a real image (no stand-in label), used as it is")
        elif label == standin.digest():
            note(f"{standin.image}: stand-in cached (recipe {label[:12]})")
        else:
            wanted.append(standin)
    if not wanted:
        return
    debootstrap = require_tool("debootstrap", "debootstrap")
    if os.geteuid() != 0:
        unavailable("building the stand-in base images needs root (debootstrap, chroot)")
    with ThreadPoolExecutor(len(wanted)) as pool:
        builds = [pool.submit(build, s, docker, debootstrap, workdir) for s in wanted]
        for standin, future in zip(wanted, builds, strict=True):
            future.result()
            note(f"{standin.image}: stand-in built (recipe {standin.digest()[:12]})")


def build(standin: StandIn, docker: Docker, debootstrap: str, workdir: Path) -> None:
    """Build one stand-in and give it its image name."""
    rootfs = workdir / standin.recipe.name
    cache = DEB_CACHE / standin.recipe.name
    cache.mkdir(parents=True, exist_ok=True)
    try:
        run(
            [
                debootstrap, "--variant=minbase", f"--include={','.join(standin.packages())}",
                f"--cache-dir={cache}", SUITE, str(rootfs), MIRROR,
            ],
            timeout=1200,
        )  # fmt: skip
        trusted = rootfs / "usr/local/share/ca-certificates"
        trusted.mkdir(parents=True, exist_ok=True)
        for certificate in host_certificates():
            shutil.copy2(certificate, trusted / certificate.name)
        shutil.copytree(standin.recipe, rootfs / "standin")
        run(["chroot", str(rootfs), "/bin/sh", "/standin/setup.sh"], timeout=600)
        for leftover in ("standin", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / leftover, ignore_errors=True)
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        digest = standin.digest()
        base = f"chassis-standin/{standin.recipe.name}:rootfs-{digest[:12]}"
        with subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE
        ) as tar:
            docker.run("import", "-", base, stdin=tar.stdout, timeout=600)
        assert tar.returncode == 0, f"tar of {rootfs} exited {tar.returncode}"
        dockerfile = (standin.recipe / "Dockerfile").read_text()
        docker.run(
            "build", "--quiet", "--build-arg", f"ROOTFS={base}", "--label", f"{LABEL}={digest}",
            "--tag", standin.image, "-",
            input=dockerfile, env={"DOCKER_BUILDKIT": "0"},
        )  # fmt: skip
    finally:
        remove_rootfs(rootfs)


def run(argv: list[str], *, timeout: float) -> None:
    """Run a build step; fail the test with its output when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, failure(done)


def remove_rootfs(rootfs: Path) -> None:
    """Delete a rootfs, after unmounting anything a failed debootstrap left mounted in it."""
    if not rootfs.exists():
        return
    for mount in sorted(mounts_below(rootfs), reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)
    # Never recurse into a host /proc or /sys that is still mounted there.
    assert not mounts_below(rootfs), f"{rootfs} still has mounts; left in place"
    shutil.rmtree(rootfs, ignore_errors=True)


def mounts_below(directory: Path) -> list[str]:
    """The mount points inside ``directory``."""
    inside = str(directory.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return [m for m in mounts if m.startswith(inside)]
