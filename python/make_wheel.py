"""Makes the wheel of the `switchboard` package (bazel build //python:wheel,
or tools/wheel): a binary wheel for the Python and the PyTorch it was built
against, installable with pip into any environment that holds that PyTorch.

    make_wheel.py --package-dir DIR --versions FILE --out WHEEL_OR_DIR

It prints the wheel's standard file name
(switchboard-<version>-<python tag>-<python tag>-linux_x86_64.whl), which
pip needs when the file was written under another (--out FILE).

DIR holds the package as //python:package lays it out (switchboard/*.py,
switchboard/_C.so, switchboard/_collective.so and
switchboard/_collective_cuda.so). FILE is @sb_venv's versions.txt ("torch=2.11.0+cu130",
"python_tag=cp312"). --out names the wheel file, or a directory to write it
into under its standard name.

What the wheel holds, in the manner of auditwheel:
- switchboard/*.py and switchboard/_C.so, whose run path is changed from
  the build's virtual environment to `$ORIGIN/../switchboard.libs`: libtorch
  itself is found because `import torch` (which switchboard.torch_rpc does
  first) has loaded it, as for every torch C++ extension;
- switchboard.libs/: the shared libraries the extensions need beyond glibc,
  libstdc++ and libgcc (Boost.System, fmt, spdlog, Gloo, OpenSSL,
  prometheus-cpp, the CUDA runtime and what they need), each with run path
  `$ORIGIN`; never NCCL (over 200 MB): _collective_cuda.so finds the one
  the process loaded or the nvidia-nccl wheel's (switchboard.collective
  loads it), and without one switchboard.collective uses _collective.so;
- the dist-info: METADATA (Requires-Dist: the PyTorch release it was built
  against, since a C++ extension is bound to one release's ABI), WHEEL
  and RECORD (sha256 of every file).

Needs ldd and patchelf. Exits non-zero, naming the step, on any failure.
"""
import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# Libraries every Linux that runs PyTorch's wheels has, and NCCL (found at
# run time, see above); never bundled.
SYSTEM_LIBRARIES = re.compile(
    r"^(linux-vdso|ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libstdc\+\+|"
    r"libgcc_s|libnccl)\.so")


def fail(message):
    sys.exit(f"make_wheel: {message}")


def run(argv):
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def read_versions(path):
    versions = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            if key:
                versions[key] = value
    for key in ("torch", "python_tag"):
        if not versions.get(key):
            fail(f"{path} names no {key}")
    return versions


def package_version(init_py):
    with open(init_py) as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not match:
        fail(f"{init_py} has no __version__")
    return match.group(1)


def needed_libraries(shared_object):
    """The libraries ldd resolves for `shared_object` that are neither the
    system's nor torch's: {soname: path}."""
    found = {}
    for line in run(["ldd", shared_object]).splitlines():
        parts = line.split()
        if "=>" not in parts:
            continue
        soname, path = parts[0], parts[2]
        if path == "not":
            fail(f"ldd {shared_object}: {soname} not found")
        if SYSTEM_LIBRARIES.match(soname) or "/torch/lib/" in path:
            continue
        found[soname] = path
    return found


def record_line(root, relative):
    with open(os.path.join(root, relative), "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(data)}"


# The package's extension modules: the torch RPC backend and the collectives.
EXTENSIONS = ("_C.so", "_collective.so", "_collective_cuda.so")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package-dir", required=True)
    parser.add_argument("--versions", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    versions = read_versions(args.versions)
    source = os.path.join(args.package_dir, "switchboard")
    version = package_version(os.path.join(source, "__init__.py"))
    torch_release = versions["torch"].split("+")[0]
    tag = f"{versions['python_tag']}-{versions['python_tag']}-linux_x86_64"
    python_version = f"{versions['python_tag'][2]}.{versions['python_tag'][3:]}"  # cp312: 3.12
    name = f"switchboard-{version}-{tag}.whl"
    out = os.path.join(args.out, name) if os.path.isdir(args.out) else args.out

    with tempfile.TemporaryDirectory() as root:
        package = os.path.join(root, "switchboard")
        libs = os.path.join(root, "switchboard.libs")
        os.makedirs(package)
        os.makedirs(libs)
        for entry in sorted(os.listdir(source)):
            if entry.endswith(".py") or entry in EXTENSIONS:
                shutil.copyfile(os.path.join(source, entry), os.path.join(package, entry))
        for name_so in EXTENSIONS:
            extension = os.path.join(package, name_so)
            if not os.path.exists(extension):
                fail(f"{source} has no {name_so}")
            # What the extension needs, and what those need in turn (ldd
            # lists the whole closure).
            for soname, path in sorted(needed_libraries(extension).items()):
                copy = os.path.join(libs, soname)
                if os.path.exists(copy):
                    continue
                shutil.copyfile(path, copy)
                os.chmod(copy, 0o755)
                run(["patchelf", "--set-rpath", "$ORIGIN", copy])
            os.chmod(extension, 0o755)
            run(["patchelf", "--set-rpath", "$ORIGIN/../switchboard.libs", extension])

        dist_info = f"switchboard-{version}.dist-info"
        os.makedirs(os.path.join(root, dist_info))
        with open(os.path.join(root, dist_info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\n"
                    "Name: switchboard\n"
                    f"Version: {version}\n"
                    "Summary: Switchboard: a SWITCHBOARD backend for torch.distributed.rpc\n"
                    f"Requires-Python: =={python_version}.*\n"
                    f"Requires-Dist: torch=={torch_release}\n")
        with open(os.path.join(root, dist_info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\n"
                    "Generator: switchboard make_wheel.py\n"
                    "Root-Is-Purelib: false\n"
                    f"Tag: {tag}\n")
        files = []
        for directory, _, names in os.walk(root):
            for entry in names:
                files.append(os.path.relpath(os.path.join(directory, entry), root))
        record = f"{dist_info}/RECORD"
        lines = [record_line(root, f) for f in sorted(files)] + [f"{record},,"]
        with open(os.path.join(root, record), "w") as f:
            f.write("\n".join(lines) + "\n")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
            for relative in sorted(files) + [record]:
                wheel.write(os.path.join(root, relative), relative)
    print(name)


if __name__ == "__main__":
    main()
