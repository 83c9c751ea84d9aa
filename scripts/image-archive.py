#!/usr/bin/env python3
"""The operator's image without a container daemon: the image the Dockerfile's last stage defines, as one archive.

    scripts/image-archive.py build --binary PATH --name REPOSITORY:TAG --out FILE [--dockerfile PATH]
                                   [--ca-bundle PATH]
    scripts/image-archive.py stage [DOCKERFILE]      the last stage as this script reads it (JSON), nothing built

The Dockerfile is read here, not restated: its last stage must start `FROM scratch` and may only use what this
script can reproduce without running the build stages:
  COPY <<NAME DEST (a here-document)          the text written as it stands in the Dockerfile (0644)
  COPY --from=STAGE SRC DEST                   where SRC is
      the file DEST = ENTRYPOINT's program names  the static binary given (--binary; refused if it is dynamic)
      .../ca-certificates.crt                      this machine's CA bundle (--ca-bundle, else the usual places)
      a directory STAGE makes with `mkdir -m MODE SRC` (or `install -d -m MODE SRC`)   an empty directory, MODE
  COPY SRC DEST (from the build context)       the file of the context (the Dockerfile's folder)
  LABEL, ENV, USER, EXPOSE, ENTRYPOINT and CMD (exec form) into the image config.
Anything else there is refused with the line it is on: build that image with a container engine, or teach this.

The archive is one tar that is both an OCI image layout (oci-layout, index.json naming the image in the
annotations io.containerd.image.name and org.opencontainers.image.ref.name, blobs/sha256/...) and a docker-archive
(manifest.json with RepoTags, repositories), as `docker save` writes since Docker 25, so that `docker load`,
`ctr images import`, `kind load image-archive`, `k3d image import`, `minikube image load` and
`skopeo copy docker-archive:`/`oci-archive:` all take it. One uncompressed layer, reproducible: entries sorted,
owners numeric (0), times SOURCE_DATE_EPOCH (default 0). Python 3.8+ standard library only.
"""

import argparse
import datetime
import hashlib
import io
import json
import os
import re
import shlex
import struct
import sys
import tarfile
import tempfile

MAPPED = "FROM scratch, LABEL, ENV, USER, EXPOSE, ENTRYPOINT, CMD and COPY (see --help)"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


class Refused(Exception):
    pass


# ---------------------------------------------------------------------------------------------- the Dockerfile
def instructions(path):
    """(line, text, heredocs) per instruction: continuation lines joined, comments dropped, here-document bodies
    (`<<NAME` ... `NAME`) taken as they stand."""
    try:
        lines = open(path, encoding="utf-8").read().split("\n")
    except OSError as e:
        raise Refused(f"cannot read the Dockerfile: {e}")
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text.startswith("#") or "=" not in text:
            break
        if text[1:].split("=", 1)[0].strip().lower() == "escape":
            raise Refused(f"{path}:{number}: the escape directive is not supported (only the default backslash)")
    result, current, start, i = [], None, 0, 0
    while i < len(lines):
        line, number = lines[i], i + 1
        i += 1
        text = line.strip()
        if current is None and (not text or text.startswith("#")):
            continue
        if current is not None and text.startswith("#"):
            continue
        if current is None:
            current, start = "", number
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        heredocs = []
        for name in re.findall(r"<<-?([A-Za-z_][A-Za-z0-9_]*)", current):
            body = []
            while i < len(lines) and lines[i] != name:
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise Refused(f"{path}:{start}: here-document {name} has no closing line")
            i += 1
            heredocs.append((name, "\n".join(body) + "\n"))
        result.append((start, current.strip(), heredocs))
        current = None
    if current is not None:
        result.append((start, current.strip(), []))
    return result


def words(where, keyword, rest):
    if "$" in rest:
        raise Refused(f"{where}: {keyword} uses a variable ($): image-archive.py does not substitute them")
    try:
        return shlex.split(rest)
    except ValueError as e:
        raise Refused(f"{where}: {keyword}: {e}")


def exec_form(where, keyword, rest):
    try:
        value = json.loads(rest)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise Refused(f"{where}: {keyword} must be in exec form (a JSON array): the image has no shell")
    return value


def split_instruction(text):
    parts = text.split(None, 1)
    return parts[0].upper(), (parts[1] if len(parts) > 1 else "").strip()


def read_stage(path):
    """The last stage: its settings and what it copies, each COPY as a dict (line, source kind, source, dest)."""
    all_ = instructions(path)
    froms = [n for n, (_, text, _) in enumerate(all_) if split_instruction(text)[0] == "FROM"]
    if not froms:
        raise Refused(f"{path}: no FROM instruction")
    # The earlier stages: their names, and the directories their RUNs make with an explicit mode.
    stages, made_dirs, current_stage = set(), {}, None
    for line, text, _ in all_[: froms[-1]]:
        keyword, rest = split_instruction(text)
        if keyword == "FROM":
            args = rest.split()
            current_stage = args[2] if len(args) == 3 and args[1].upper() == "AS" else None
            if current_stage:
                stages.add(current_stage)
        elif keyword == "RUN" and current_stage:
            pattern = r"(?:mkdir|install -d)(?:\s+-p)?\s+-m\s*([0-7]{3,4})(?:\s+-p)?\s+(/[^\s;&|]+)"
            for mode, directory in re.findall(pattern, rest):
                made_dirs[(current_stage, directory.rstrip("/"))] = int(mode, 8)
    stage = {"copies": [], "user": "", "entrypoint": None, "cmd": None, "exposed": [], "labels": {},
             "env": [], "stages": sorted(stages)}
    for line, text, heredocs in all_[froms[-1]:]:
        where = f"{path}:{line}"
        keyword, rest = split_instruction(text)
        if keyword == "FROM":
            args = words(where, keyword, rest)
            if not args or args[0] != "scratch" or len(args) not in (1, 3):
                raise Refused(f"{where}: the last stage must be `FROM scratch` (this script adds every file itself), "
                              f"got FROM {rest}")
        elif keyword == "LABEL":
            args = words(where, keyword, rest)
            if len(args) >= 2 and "=" not in args[0]:
                args = [args[0] + "=" + " ".join(args[1:])]
            for arg in args:
                if "=" not in arg:
                    raise Refused(f"{where}: LABEL: expected KEY=VALUE, got '{arg}'")
                key, value = arg.split("=", 1)
                stage["labels"][key] = value
        elif keyword == "ENV":
            args = words(where, keyword, rest)
            if len(args) >= 2 and "=" not in args[0]:
                args = [args[0] + "=" + " ".join(args[1:])]
            for arg in args:
                if "=" not in arg:
                    raise Refused(f"{where}: ENV: expected KEY=VALUE, got '{arg}'")
                stage["env"].append(arg)
        elif keyword == "USER":
            args = words(where, keyword, rest)
            if len(args) != 1:
                raise Refused(f"{where}: USER takes one USER[:GROUP]")
            stage["user"] = args[0]
        elif keyword == "EXPOSE":
            for port in words(where, keyword, rest):
                number, _, proto = port.partition("/")
                proto = proto.lower() or "tcp"
                if not number.isdigit() or proto not in ("tcp", "udp", "sctp"):
                    raise Refused(f"{where}: EXPOSE {port}: expected PORT[/tcp|udp|sctp]")
                stage["exposed"].append(f"{int(number)}/{proto}")
        elif keyword in ("ENTRYPOINT", "CMD"):
            stage[keyword.lower()] = exec_form(where, keyword, rest)
        elif keyword == "COPY":
            stage["copies"].append(read_copy(where, rest, heredocs, stages, made_dirs))
        else:
            raise Refused(f"{where}: {keyword} in the last stage has no mapping in image-archive.py "
                          f"(it maps {MAPPED}); build that image with a container engine, or teach the script")
    entrypoint = stage["entrypoint"] or []
    binaries = [c for c in stage["copies"] if c["kind"] == "stage" and entrypoint and c["dest"] == entrypoint[0]]
    for copy in stage["copies"]:
        if copy["kind"] != "stage":
            continue
        if copy in binaries:
            copy["kind"] = "binary"
        elif copy["source"].endswith("/ca-certificates.crt"):
            copy["kind"] = "ca-bundle"
        elif (copy["from"], copy["source"].rstrip("/")) in made_dirs:
            copy["kind"] = "directory"
            copy["mode"] = made_dirs[(copy["from"], copy["source"].rstrip("/"))]
        else:
            raise Refused(f"{copy['where']}: COPY --from={copy['from']} {copy['source']}: no mapping (the "
                          "entrypoint's binary, a ca-certificates.crt, or a directory the stage makes with "
                          "`mkdir -m MODE`)")
    if not binaries:
        raise Refused(f"{path}: the last stage copies no binary to ENTRYPOINT's program "
                      f"({entrypoint[0] if entrypoint else 'no ENTRYPOINT'})")
    dests = [c["dest"] for c in stage["copies"]]
    if len(set(dests)) != len(dests):
        raise Refused(f"{path}: the last stage copies twice to the same path")
    for copy in stage["copies"]:
        del copy["where"]
    return stage


def read_copy(where, rest, heredocs, stages, made_dirs):
    if rest.startswith("["):
        args = exec_form(where, "COPY", rest)
    else:
        args = words(where, "COPY", rest)
    flags = [a for a in args if a.startswith("--")]
    paths = [a for a in args if not a.startswith("--")]
    source_stage = None
    for flag in flags:
        if flag.startswith("--from="):
            source_stage = flag.split("=", 1)[1]
        else:
            raise Refused(f"{where}: COPY {flag}: only --from has a mapping")
    if len(paths) != 2:
        raise Refused(f"{where}: COPY: one source and one destination only")
    source, dest = paths
    if not dest.startswith("/"):
        raise Refused(f"{where}: COPY destination {dest} is relative (no WORKDIR mapping)")
    if dest.endswith("/") and not source.startswith("<<"):
        dest += source.rstrip("/").rsplit("/", 1)[-1]
    copy = {"where": where, "dest": dest.rstrip("/") or "/", "from": source_stage, "source": source}
    if source.startswith("<<"):
        if source_stage is not None:
            raise Refused(f"{where}: COPY --from with a here-document")
        name = source.lstrip("<-")
        bodies = dict(heredocs)
        if name not in bodies or dest.endswith("/"):
            raise Refused(f"{where}: COPY <<{name}: a here-document to a file path")
        copy.update(kind="heredoc", text=bodies[name], source=f"<<{name}")
    elif source_stage is None:
        copy["kind"] = "context"
    else:
        if source_stage not in stages:
            raise Refused(f"{where}: COPY --from={source_stage}: not a stage of this Dockerfile (images cannot be "
                          "read without a daemon)")
        copy["kind"] = "stage"
    return copy


# ---------------------------------------------------------------------------------------------- the binary
def elf_facts(path):
    """(architecture as OCI names it, whether it asks for a program interpreter, i.e. is dynamically linked)."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise Refused(f"{path}: not a 64-bit little-endian ELF executable")
        machine = struct.unpack_from("<H", header, 0x12)[0]
        phoff = struct.unpack_from("<Q", header, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    interpreter = any(struct.unpack_from("<I", table, n * phentsize)[0] == 3 for n in range(phnum))
    arch = {0x3E: "amd64", 0xB7: "arm64"}.get(machine)
    if arch is None:
        raise Refused(f"{path}: ELF machine {machine:#x} has no OCI architecture here")
    return arch, interpreter


# ---------------------------------------------------------------------------------------------- the archive
def tar_info(name, epoch, kind=tarfile.REGTYPE, mode=0o644, size=0):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build(args):
    dockerfile = os.path.abspath(args.dockerfile)
    stage = read_stage(dockerfile)
    context = os.path.dirname(dockerfile)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    if ":" not in args.name.rsplit("/", 1)[-1] or "@" in args.name:
        raise Refused(f"--name {args.name}: expected REPOSITORY:TAG")
    repository, tag = args.name.rsplit(":", 1)
    arch, dynamic = elf_facts(args.binary)
    if dynamic:
        raise Refused(f"{args.binary} is dynamically linked: the image has no libraries (build it with "
                      "`-C target-feature=+crt-static`, see scripts/release.sh)")

    # What goes into the layer: path -> (kind, mode, source file or bytes).
    files = {}
    for copy in stage["copies"]:
        dest = copy["dest"].lstrip("/")
        if copy["kind"] == "heredoc":
            files[dest] = ("file", 0o644, copy["text"].encode())
        elif copy["kind"] == "context":
            source = os.path.join(context, copy["source"])
            if not os.path.isfile(source):
                raise Refused(f"COPY {copy['source']}: no such file in the build context {context}")
            files[dest] = ("file", 0o755 if os.access(source, os.X_OK) else 0o644, source)
        elif copy["kind"] == "binary":
            files[dest] = ("file", 0o755, args.binary)
        elif copy["kind"] == "ca-bundle":
            bundle = args.ca_bundle or next((c for c in CA_BUNDLES if os.path.isfile(c)), None)
            if bundle is None:
                raise Refused("no CA bundle on this machine (install ca-certificates, or pass --ca-bundle)")
            files[dest] = ("file", 0o644, bundle)
        elif copy["kind"] == "directory":
            files[dest] = ("dir", copy["mode"], None)
    for path in list(files):
        parts = path.split("/")
        for n in range(1, len(parts)):
            files.setdefault("/".join(parts[:n]), ("dir", 0o755, None))

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".image-archive.") as work:
        layer_path = os.path.join(work, "layer.tar")
        with tarfile.open(layer_path, "w", format=tarfile.GNU_FORMAT) as layer:
            for path in sorted(files):
                kind, mode, source = files[path]
                if kind == "dir":
                    layer.addfile(tar_info(path, epoch, tarfile.DIRTYPE, mode))
                elif isinstance(source, bytes):
                    layer.addfile(tar_info(path, epoch, mode=mode, size=len(source)), io.BytesIO(source))
                else:
                    with open(source, "rb") as f:
                        layer.addfile(tar_info(path, epoch, mode=mode, size=os.fstat(f.fileno()).st_size), f)
        digest = hashlib.sha256()
        with open(layer_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        layer_hex, layer_size = digest.hexdigest(), os.path.getsize(layer_path)

        created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        env = [e for e in stage["env"]]
        if not any(e.startswith("PATH=") for e in env):
            env.insert(0, DEFAULT_PATH)  # as the Dockerfile frontend sets it on a scratch image
        image_config = {"Env": env}
        for key, value in (("User", stage["user"]), ("Entrypoint", stage["entrypoint"]), ("Cmd", stage["cmd"])):
            if value:
                image_config[key] = value
        if stage["exposed"]:
            image_config["ExposedPorts"] = {port: {} for port in stage["exposed"]}
        if stage["labels"]:
            image_config["Labels"] = stage["labels"]
        config = {"architecture": arch, "os": "linux", "created": created, "config": image_config,
                  "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]},
                  "history": [{"created": created, "created_by": "scripts/image-archive.py"}]}
        config_bytes = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
        config_hex = hashlib.sha256(config_bytes).hexdigest()
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": f"sha256:{config_hex}", "size": len(config_bytes)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": f"sha256:{layer_hex}", "size": layer_size}]}
        manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
        manifest_hex = hashlib.sha256(manifest_bytes).hexdigest()
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "digest": f"sha256:{manifest_hex}", "size": len(manifest_bytes),
                                "platform": {"architecture": arch, "os": "linux"},
                                "annotations": {"io.containerd.image.name": args.name,
                                                "org.opencontainers.image.ref.name": tag}}]}
        docker_manifest = [{"Config": f"blobs/sha256/{config_hex}", "RepoTags": [args.name],
                            "Layers": [f"blobs/sha256/{layer_hex}"]}]
        small = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index, separators=(",", ":")).encode(),
            "manifest.json": json.dumps(docker_manifest, separators=(",", ":")).encode(),
            "repositories": json.dumps({repository: {tag: layer_hex}}, separators=(",", ":")).encode(),
            f"blobs/sha256/{config_hex}": config_bytes,
            f"blobs/sha256/{manifest_hex}": manifest_bytes,
        }
        tmp_out = os.path.join(work, "archive.tar")
        with tarfile.open(tmp_out, "w", format=tarfile.GNU_FORMAT) as archive:
            for directory in ("blobs", "blobs/sha256"):
                archive.addfile(tar_info(directory, epoch, tarfile.DIRTYPE, 0o755))
            names = sorted(list(small) + [f"blobs/sha256/{layer_hex}"])
            for name in names:
                if name in small:
                    archive.addfile(tar_info(name, epoch, size=len(small[name])), io.BytesIO(small[name]))
                else:
                    with open(layer_path, "rb") as f:
                        archive.addfile(tar_info(name, epoch, size=layer_size), f)
        os.replace(tmp_out, args.out)
    print(f"image-archive.py: wrote {args.out}: {args.name} ({arch}), manifest sha256:{manifest_hex}, "
          f"{os.path.getsize(args.out) // 1024} KiB", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    b = commands.add_parser("build", help="write the archive")
    b.add_argument("--dockerfile", default=os.path.join(here, "Dockerfile"))
    b.add_argument("--binary", required=True, help="the static binary for ENTRYPOINT's program")
    b.add_argument("--name", required=True, help="REPOSITORY:TAG, e.g. localhost/redlock-operator:0.2.0")
    b.add_argument("--out", required=True, help="the archive to write")
    b.add_argument("--ca-bundle", help="the CA bundle for a copied ca-certificates.crt (default: this machine's)")
    s = commands.add_parser("stage", help="print the last stage as read (JSON)")
    s.add_argument("dockerfile", nargs="?", default=os.path.join(here, "Dockerfile"))
    args = parser.parse_args()
    try:
        if args.command == "build":
            build(args)
        else:
            json.dump(read_stage(args.dockerfile), sys.stdout, indent=2)
            print()
    except Refused as e:
        sys.exit(f"image-archive.py: {e}")
    except OSError as e:
        sys.exit(f"image-archive.py: {e}")


if __name__ == "__main__":
    main()
