#!/usr/bin/env python3
"""Builds ebbflow's container images without a container engine, as OCI image archives.

    scripts/oci-image.py --bin-dir DIR --out DIR [--tag TAG] [--no-compress] [--no-strip]
    scripts/oci-image.py --pause BINARY --out DIR [--tag TAG]
    scripts/oci-image.py --python-bin BINARY --site-packages DIR --sdk DIR [--examples DIR] --out DIR [--tag TAG]

writes `ebbflow-operator-TAG.oci.tar` and `ebbflow-runtime-TAG.oci.tar` into --out: OCI image
layouts in a tar (what `skopeo copy oci-archive:FILE docker://REGISTRY/NAME:TAG`, `podman load`
and `docker load` (25+) read). Each image is two layers:

- a base: the C libraries the binaries link (found with `ldd`, read from this machine), the CA
  bundle, `/etc/passwd` and `/etc/group` with the `nonroot` user (65532) the pods run as, and
  `/tmp`;
- the binary (`ebbflow-operator`, or `ebbflow` for the runtime pods, whose command is
  `ebbflow pod`) in `/usr/local/bin`, stripped of debug info unless --no-strip.

With --python-bin it writes `ebbflow-runtime-python-TAG.oci.tar` instead: the runtime image for
Python apps (`kind: Python` jobs). Its `ebbflow` is the one built with `--features python`; the
image adds the CPython it links (the shared library, the standard library without its tests,
PYTHONHOME), numpy from --site-packages, the SDK's `ebbflow` package (its native part is built
into the binary) on PYTHONPATH at /opt/ebbflow/python, and the examples at /opt/ebbflow/examples.
A user's image adds their code on top of it (`FROM` it, or the Dockerfile's `runtime-python`).

With --pause it writes `ebbflow-pause-TAG.oci.tar` instead: the pod sandbox image the real-node
test stage's containerd uses (one layer, the static binary at /pause), so no registry is needed.

The archives are reproducible: sorted entries, owner 0, fixed times (SOURCE_DATE_EPOCH, default
0), gzip without a name or time. The `Dockerfile` at the repository root builds the same
images with a container engine, from source.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
NONROOT = 65532
IMAGES = {
    # image name: (binary, entrypoint, cmd)
    "ebbflow-operator": ("ebbflow-operator", ["/usr/local/bin/ebbflow-operator"], []),
    "ebbflow-runtime": ("ebbflow", [], ["ebbflow", "pod"]),
}
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# glibc malloc with a fixed 128 KiB mmap threshold: a node's large transport buffers go back to
# the system when freed instead of staying in per-thread arenas (NODE_MALLOC_TUNABLES in
# operator/job/src/run/instances.rs, which `ebbflow run` gives its node processes).
MALLOC_TUNABLES = "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072"


class ImageError(Exception):
    """A clear, one-line reason the images could not be built."""


def linked_libraries(binary):
    """The shared libraries `binary` loads (absolute paths on this machine)."""
    try:
        out = subprocess.run(
            ["ldd", binary], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ImageError(f"ldd {binary}: {getattr(e, 'stderr', '') or e}") from e
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            raise ImageError(f"{binary} links a library this machine lacks: {line}")
        match = re.search(r"(/\S+)\s+\(0x", line)
        if match:
            libs.append(match.group(1))
    return libs


class Layer:
    """A deterministic tar layer built in memory."""

    def __init__(self, mtime):
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)
        self.mtime = mtime
        self.dirs = set()

    def _info(self, name, kind, mode, size=0, uid=0):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.size = size
        info.mtime = self.mtime
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    def directory(self, path, mode=0o755):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.dirs:
                self.dirs.add(sub)
                self.tar.addfile(self._info(sub + "/", tarfile.DIRTYPE, mode))

    def file(self, path, data, mode=0o644):
        self.directory(os.path.dirname(path))
        info = self._info(path.strip("/"), tarfile.REGTYPE, mode, len(data))
        self.tar.addfile(info, io.BytesIO(data))

    def symlink(self, path, target):
        self.directory(os.path.dirname(path))
        info = self._info(path.strip("/"), tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def close(self):
        self.tar.close()
        return self.buffer.getvalue()


def base_layer(binaries, mtime, extra_libs=()):
    layer = Layer(mtime)
    libs = sorted({lib for b in binaries for lib in linked_libraries(b)} | set(extra_libs))
    for lib in libs:
        with open(lib, "rb") as f:
            layer.file(lib, f.read(), 0o755)
    if os.path.exists(CA_BUNDLE):
        with open(CA_BUNDLE, "rb") as f:
            layer.file(CA_BUNDLE, f.read())
    layer.file(
        "/etc/passwd",
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n".encode(),
    )
    layer.file("/etc/group", f"root:x:0:\nnonroot:x:{NONROOT}:\n".encode())
    layer.directory("/home/nonroot")
    layer.directory("/tmp", 0o1777)
    return layer.close(), libs


def binary_layer(binary, name, mtime, strip):
    layer = Layer(mtime)
    if strip:
        with tempfile.TemporaryDirectory() as tmp:
            stripped = os.path.join(tmp, name)
            try:
                subprocess.run(
                    ["objcopy", "--strip-debug", binary, stripped],
                    check=True,
                    capture_output=True,
                    text=True,
                )
            except (OSError, subprocess.CalledProcessError) as e:
                raise ImageError(
                    f"objcopy --strip-debug {binary}: {getattr(e, 'stderr', '') or e}"
                ) from e
            with open(stripped, "rb") as f:
                data = f.read()
    else:
        with open(binary, "rb") as f:
            data = f.read()
    layer.file(f"/usr/local/bin/{name}", data, 0o755)
    return layer.close()


class Blobs:
    """Content-addressed blobs of one image layout."""

    def __init__(self):
        self.blobs = {}

    def add(self, data, media_type):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}


def layer_blob(blobs, tar_bytes, compress):
    diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
    if compress:
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
            gz.write(tar_bytes)
        return blobs.add(out.getvalue(), "application/vnd.oci.image.layer.v1.tar+gzip"), diff_id
    return blobs.add(tar_bytes, "application/vnd.oci.image.layer.v1.tar"), diff_id


def write_archive(path, blobs, manifest_descriptor, ref, mtime):
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            dict(manifest_descriptor, annotations={"org.opencontainers.image.ref.name": ref})
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for digest, data in blobs.blobs.items():
        entries["blobs/sha256/" + digest.split(":", 1)[1]] = data
    tmp = path + ".partial"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ["blobs", "blobs/sha256"]:
            info = tarfile.TarInfo(name + "/")
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for name in sorted(entries):
            data = entries[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


def write_image(out, image, tag, mtime, layers, entrypoint, cmd, user, env, history, workdir=None):
    """Writes `image`-`tag`.oci.tar into `out` from uncompressed layer tars; returns
    (path, manifest digest, bytes of layers)."""
    machine = os.uname().machine
    if machine not in ARCH:
        raise ImageError(f"unsupported machine architecture {machine}")
    blobs = Blobs()
    descriptors, diff_ids = [], []
    for tar_bytes, compress in layers:
        descriptor, diff_id = layer_blob(blobs, tar_bytes, compress)
        descriptors.append(descriptor)
        diff_ids.append(diff_id)
    config = {
        "architecture": ARCH[machine],
        "os": "linux",
        "config": {
            "User": user,
            "Env": env,
            "Labels": {
                "org.opencontainers.image.title": image,
                "org.opencontainers.image.version": tag,
                "org.opencontainers.image.source": "https://github.com/ebbflow/ebbflow",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": h} for h in history],
    }
    if workdir:
        config["config"]["WorkingDir"] = workdir
    if entrypoint:
        config["config"]["Entrypoint"] = entrypoint
    if cmd:
        config["config"]["Cmd"] = cmd
    config_desc = blobs.add(
        json.dumps(config, sort_keys=True).encode(),
        "application/vnd.oci.image.config.v1+json",
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": descriptors,
    }
    manifest_desc = blobs.add(
        json.dumps(manifest, sort_keys=True).encode(),
        "application/vnd.oci.image.manifest.v1+json",
    )
    path = os.path.join(out, f"{image}-{tag}.oci.tar")
    write_archive(path, blobs, manifest_desc, tag, mtime)
    return path, manifest_desc["digest"], sum(d["size"] for d in descriptors)


def build_pause(args, mtime):
    """The pod sandbox image: a static pause binary (tests/cluster/pause/pause.c) alone."""
    if not os.path.isfile(args.pause) or not os.access(args.pause, os.X_OK):
        raise ImageError(f"--pause {args.pause}: not an executable file")
    if linked_libraries_or_static(args.pause):
        raise ImageError(f"--pause {args.pause}: must be linked statically (gcc -static)")
    layer = Layer(mtime)
    with open(args.pause, "rb") as f:
        layer.file("/pause", f.read(), 0o755)
    return write_image(
        args.out, "ebbflow-pause", args.tag, mtime, [(layer.close(), args.compress)],
        ["/pause"], [], "65535:65535", ["PATH=/"], ["scripts/oci-image.py: /pause"],
    )


# Parts of the standard library a runtime never imports: tests, GUIs, the packaging bootstrap.
STDLIB_SKIP = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip",
               "lib2to3", "site-packages", "dist-packages", "__pycache__"}
PYTHON_PACKAGES = "/opt/ebbflow/python"
PYTHON_EXAMPLES = "/opt/ebbflow/examples"


def tree_files(root, skip=frozenset()):
    """(absolute path, path relative to root) of the files under root, sorted, skipping
    directories named in `skip`, compiled bytecode and config-* build directories."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("config-"))
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            found.append((path, os.path.relpath(path, root)))
    return found


def add_tree(layer, root, at, skip=frozenset()):
    """Copies the files under `root` to `at` in `layer` (symlinks as links); returns the
    shared objects copied."""
    shared = []
    for path, rel in tree_files(root, skip):
        target = os.path.join(at, rel)
        if os.path.islink(path):
            layer.symlink(target, os.readlink(path))
            continue
        mode = 0o755 if os.access(path, os.X_OK) else 0o644
        with open(path, "rb") as f:
            layer.file(target, f.read(), mode)
        if ".so" in os.path.basename(path):
            shared.append(path)
    return shared


def python_home(binary):
    """The CPython `binary` links: (its shared library, its prefix, its standard library)."""
    libpython = [lib for lib in linked_libraries(binary) if "libpython3" in os.path.basename(lib)]
    if not libpython:
        raise ImageError(f"--python-bin {binary} links no libpython: build it with --features python")
    real = os.path.realpath(libpython[0])
    version = re.search(r"libpython(3\.\d+)", real).group(1)
    prefix = os.path.dirname(real)
    while prefix != "/" and os.path.basename(prefix) != "lib":
        prefix = os.path.dirname(prefix)
    prefix = os.path.dirname(prefix)
    stdlib = os.path.join(prefix, "lib", f"python{version}")
    if not os.path.isfile(os.path.join(stdlib, "os.py")):
        raise ImageError(f"{binary} links {real}, but {stdlib} holds no standard library")
    return real, prefix, stdlib


def build_python(args, mtime):
    """The runtime image for Python apps (see the module docs)."""
    binary = args.python_bin
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise ImageError(f"--python-bin {binary}: not an executable file")
    for flag, path in (("--site-packages", args.site_packages), ("--sdk", args.sdk)):
        if not path or not os.path.isdir(path):
            raise ImageError(f"{flag} {path}: not a directory")
    numpy = os.path.join(args.site_packages, "numpy")
    if not os.path.isdir(numpy):
        raise ImageError(f"--site-packages {args.site_packages}: no numpy (pip install numpy there)")
    libpython, prefix, stdlib = python_home(binary)
    python = Layer(mtime)
    shared = add_tree(python, stdlib, stdlib, STDLIB_SKIP)
    packages = Layer(mtime)
    for name in sorted(os.listdir(args.site_packages)):
        if name == "numpy" or name.startswith("numpy.libs") or name.startswith("numpy-"):
            shared += add_tree(packages, os.path.join(args.site_packages, name),
                               os.path.join(PYTHON_PACKAGES, name), {"tests", "__pycache__"})
    # The SDK's Python part; its native module (_core) is built into the binary.
    for path, rel in tree_files(args.sdk, {"__pycache__"}):
        if rel.endswith(".py"):
            with open(path, "rb") as f:
                packages.file(os.path.join(PYTHON_PACKAGES, "ebbflow", rel), f.read())
    if args.examples:
        for path, rel in tree_files(args.examples, {"__pycache__"}):
            with open(path, "rb") as f:
                packages.file(os.path.join(PYTHON_EXAMPLES, rel), f.read())
    # The C libraries of the binary and of the extension modules, except those the layers
    # above carry themselves (numpy.libs).
    carried = (stdlib + "/", args.site_packages.rstrip("/") + "/")
    modules = [so for so in shared if not os.path.dirname(so).endswith(".libs")]
    extra = sorted({lib for so in modules for lib in linked_libraries_or_static(so)
                    if not lib.startswith(carried)})
    base_tar, libs = base_layer([binary], mtime, extra)
    app_tar = binary_layer(binary, "ebbflow", mtime, args.strip)
    written = write_image(
        args.out, "ebbflow-runtime-python", args.tag, mtime,
        [(base_tar, args.compress), (python.close(), args.compress),
         (packages.close(), args.compress), (app_tar, args.compress)],
        [], ["ebbflow", "pod"], f"{NONROOT}:{NONROOT}",
        ["PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + CA_BUNDLE, MALLOC_TUNABLES,
         f"PYTHONHOME={prefix}", f"PYTHONPATH={PYTHON_PACKAGES}", "PYTHONDONTWRITEBYTECODE=1"],
        [
            "scripts/oci-image.py: C libraries, CA bundle, nonroot user",
            f"scripts/oci-image.py: the standard library of {libpython}",
            f"scripts/oci-image.py: numpy, the ebbflow SDK, the examples",
            "scripts/oci-image.py: /usr/local/bin/ebbflow (--features python)",
        ],
        workdir="/home/nonroot",
    )
    print(f"python image: {libpython}, PYTHONHOME={prefix}; libraries: {', '.join(libs)}")
    return [written]


def linked_libraries_or_static(binary):
    """The libraries `binary` loads; empty for a static binary (where ldd exits non-zero)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if out.returncode != 0 or "not a dynamic executable" in out.stdout + out.stderr:
        return []
    return linked_libraries(binary)


def build(args):
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    os.makedirs(args.out, exist_ok=True)
    if args.pause:
        written = [build_pause(args, mtime)]
    elif args.python_bin:
        written = build_python(args, mtime)
    else:
        written = build_ebbflow(args, mtime)
    for path, digest, size in written:
        print(f"{path}  {digest}  {size / 2**20:.1f} MiB of layers")


def build_ebbflow(args, mtime):
    binaries = {}
    for image, (binary, _, _) in IMAGES.items():
        path = os.path.join(args.bin_dir, binary)
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise ImageError(
                f"--bin-dir {args.bin_dir}: no executable {binary} (build it with "
                f"`cargo build --release --locked -p ebbflow-operator -p ebbflow-job "
                f"--features ebbflow-operator/ec2 --bins`)"
            )
        binaries[image] = path
    base_tar, libs = base_layer(list(binaries.values()), mtime)
    written = []
    for image, (binary, entrypoint, cmd) in IMAGES.items():
        app_tar = binary_layer(binaries[image], binary, mtime, args.strip)
        written.append(
            write_image(
                args.out, image, args.tag, mtime,
                [(base_tar, args.compress), (app_tar, args.compress)],
                entrypoint, cmd, f"{NONROOT}:{NONROOT}",
                ["PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + CA_BUNDLE, MALLOC_TUNABLES],
                [
                    "scripts/oci-image.py: C libraries, CA bundle, nonroot user",
                    f"scripts/oci-image.py: /usr/local/bin/{binary}",
                ],
                workdir="/home/nonroot",
            )
        )
    print(f"base layer libraries: {', '.join(libs)}")
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", help="directory holding ebbflow and ebbflow-operator")
    parser.add_argument(
        "--pause",
        metavar="BINARY",
        help="write only the pod sandbox image ebbflow-pause-TAG from this static pause binary",
    )
    parser.add_argument(
        "--python-bin",
        metavar="BINARY",
        help="write only the Python runtime image ebbflow-runtime-python-TAG from this ebbflow "
        "(built with --features python)",
    )
    parser.add_argument("--site-packages", help="with --python-bin: a site-packages holding numpy")
    parser.add_argument("--sdk", help="with --python-bin: the SDK's package directory (python/ebbflow)")
    parser.add_argument("--examples", help="with --python-bin: example apps for /opt/ebbflow/examples")
    parser.add_argument("--out", required=True, help="directory for the .oci.tar archives")
    parser.add_argument("--tag", default="dev", help="image tag (ref name in the archive)")
    parser.add_argument("--no-compress", dest="compress", action="store_false", help="uncompressed layers")
    parser.add_argument("--no-strip", dest="strip", action="store_false", help="keep debug info")
    args = parser.parse_args()
    if not args.pause and not args.python_bin and not args.bin_dir:
        parser.error("--bin-dir is required (or --pause BINARY, or --python-bin BINARY)")
    try:
        build(args)
    except ImageError as e:
        print(f"oci-image: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
