//! The operator image that scripts/image-archive.py builds without a container daemon (the image archive of
//! scripts/release.sh, and scripts/build-images.sh's operator image) is the one the Dockerfile's last stage
//! defines: its user, entrypoint, command, exposed ports, labels and environment, and exactly the files the stage
//! copies (here-documents as written, the binary at the entrypoint's path, the CA bundle, /tmp with the mode the
//! build stage gives it). The stage is read here on its own, not by the script's parser. The archive is both an
//! OCI image layout and a docker-archive naming the same blobs, and reproducible; an instruction the script cannot
//! map, and a dynamically linked binary, are refused. Crate, chart and image share the version.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An x86_64 executable that exits 0 (an ELF header, a loadable segment, `exit(0)`): what the builder needs of a
/// binary, without a crt-static build of the operator in the test. With `interpreter`, it also names a program
/// interpreter (PT_INTERP), as a dynamically linked executable does.
fn elf(path: &Path, interpreter: bool) {
    const INTERPRETER: &[u8] = b"/lib64/ld-linux-x86-64.so.2\0";
    let code: [u8; 9] = [0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]; // mov eax, 60; xor edi, edi; syscall
    let headers = if interpreter { 2u16 } else { 1 };
    let code_at = 64 + 56 * u64::from(headers);
    let size = code_at + code.len() as u64 + if interpreter { INTERPRETER.len() as u64 } else { 0 };
    let mut elf = Vec::new();
    elf.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // x86_64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&(0x400000 + code_at).to_le_bytes()); // entry: the code after the headers
    elf.extend_from_slice(&64u64.to_le_bytes()); // program headers right after this header
    elf.extend_from_slice(&0u64.to_le_bytes());
    elf.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, headers, 64, 0, 0] {
        elf.extend_from_slice(&half.to_le_bytes());
    }
    let mut header = |kind: u32, flags: u32, words: [u64; 6]| {
        elf.extend_from_slice(&kind.to_le_bytes());
        elf.extend_from_slice(&flags.to_le_bytes());
        for word in words {
            elf.extend_from_slice(&word.to_le_bytes());
        }
    };
    if interpreter {
        let at = code_at + code.len() as u64;
        let length = INTERPRETER.len() as u64;
        header(3, 4, [at, 0x400000 + at, 0x400000 + at, length, length, 1]); // PT_INTERP
    }
    header(1, 5, [0, 0x400000, 0x400000, size, size, 0x1000]); // PT_LOAD, read and execute
    elf.extend_from_slice(&code);
    if interpreter {
        elf.extend_from_slice(INTERPRETER);
    }
    std::fs::write(path, elf).expect("write the ELF");
    let mut permissions = std::fs::metadata(path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(path, permissions).expect("chmod");
}

/// scripts/image-archive.py build --binary BINARY --name NAME --out OUT EXTRA...
fn image_archive(binary: &Path, name: &str, out: &Path, extra: &[&str]) -> Output {
    Command::new("python3")
        .arg(Path::new(ROOT).join("scripts/image-archive.py"))
        .args(["build", "--name", name])
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .expect("python3 runs scripts/image-archive.py")
}

/// `tar ARGS...`'s stdout; it must succeed.
fn tar(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let out = Command::new("tar").args(args).output().expect("tar runs");
    assert!(out.status.success(), "tar {args:?}: {}", text(&out.stderr));
    out.stdout
}

// ------------------------------------------------------------------------------------------- the Dockerfile
/// One COPY of the last stage.
#[derive(Debug)]
struct Copy {
    from: Option<String>,
    source: String,
    dest: String,
    /// The here-document's text, for `COPY <<NAME DEST`.
    heredoc: Option<String>,
}

/// What the Dockerfile's last stage sets, and the text of the stages before it.
#[derive(Debug, Default)]
struct LastStage {
    user: String,
    entrypoint: Value,
    cmd: Value,
    exposed: BTreeSet<String>,
    labels: BTreeMap<String, String>,
    env: Vec<String>,
    copies: Vec<Copy>,
    earlier: String,
}

/// Instructions with continuation lines joined and comment lines dropped, each with its here-documents' bodies.
fn instructions(dockerfile: &str) -> Vec<(String, Vec<String>)> {
    let mut all = Vec::new();
    let mut current = String::new();
    let mut lines = dockerfile.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(part) = line.trim_end().strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let instruction = std::mem::take(&mut current).trim().to_owned();
        let mut bodies = Vec::new();
        for word in instruction.split_whitespace() {
            if let Some(name) = word.strip_prefix("<<") {
                let mut body = String::new();
                for line in lines.by_ref().take_while(|line| *line != name) {
                    body.push_str(line);
                    body.push('\n');
                }
                bodies.push(body);
            }
        }
        all.push((instruction, bodies));
    }
    all
}

/// Words split at blanks outside double quotes, the quotes removed (LABEL's `key="a value"`).
fn words(text: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => (quoted, any) = (!quoted, true),
            '\\' if quoted => word.extend(chars.next()),
            c if c.is_whitespace() && !quoted => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

fn last_stage(dockerfile: &str) -> LastStage {
    let all = instructions(dockerfile);
    let last_from = all
        .iter()
        .rposition(|(i, _)| i.to_uppercase().starts_with("FROM "))
        .expect("a FROM");
    let mut stage = LastStage {
        earlier: all[..last_from]
            .iter()
            .map(|(i, _)| i.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        ..LastStage::default()
    };
    assert_eq!(all[last_from].0, "FROM scratch", "the image starts empty");
    for (instruction, bodies) in &all[last_from + 1..] {
        let (keyword, rest) = instruction
            .split_once(char::is_whitespace)
            .expect("an instruction with arguments");
        let rest = rest.trim();
        match keyword.to_uppercase().as_str() {
            "LABEL" => {
                for pair in words(rest) {
                    let (key, value) = pair.split_once('=').expect("LABEL key=value");
                    stage.labels.insert(key.to_owned(), value.to_owned());
                }
            }
            "ENV" => stage.env.extend(words(rest)),
            "COPY" => {
                let args = words(rest);
                let from = args
                    .iter()
                    .find_map(|a| a.strip_prefix("--from="))
                    .map(str::to_owned);
                let paths: Vec<&String> = args.iter().filter(|w| !w.starts_with("--")).collect();
                let [source, dest] = paths.as_slice() else {
                    panic!("COPY SRC DEST, got {rest}")
                };
                let dest = match dest.strip_suffix('/') {
                    Some(dir) => format!("{dir}/{}", source.rsplit('/').next().unwrap_or(source)),
                    None => dest.to_string(),
                };
                let heredoc = source.starts_with("<<").then(|| bodies[0].clone());
                stage.copies.push(Copy {
                    from,
                    source: source.to_string(),
                    dest,
                    heredoc,
                });
            }
            "USER" => stage.user = rest.to_owned(),
            "EXPOSE" => {
                for port in rest.split_whitespace() {
                    let port = if port.contains('/') {
                        port.to_owned()
                    } else {
                        format!("{port}/tcp")
                    };
                    stage.exposed.insert(port);
                }
            }
            "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT in exec form"),
            "CMD" => stage.cmd = serde_json::from_str(rest).expect("CMD in exec form"),
            other => panic!("this test does not read {other} in the last stage yet: teach it"),
        }
    }
    stage
}

// ------------------------------------------------------------------------------------------- the archive
fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// The image an archive holds, read through both its views, which must name the same blobs.
struct Unpacked {
    config: Value,
    layer: PathBuf,
    /// The OCI view's name annotations and the docker view's RepoTags and repositories.
    oci_name: Value,
    oci_ref: Value,
    repo_tags: Value,
    repositories: Value,
}

fn unpack(archive: &Path, dir: &Path) -> Unpacked {
    tar(&[
        "-xf".as_ref(),
        archive.as_os_str(),
        "-C".as_ref(),
        dir.as_os_str(),
    ]);
    let read =
        |name: &str| -> Vec<u8> { std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}")) };
    let json = |name: &str| -> Value { serde_json::from_slice(&read(name)).expect("JSON") };
    // The blob a descriptor names, checked against its digest and size.
    let blob = |descriptor: &Value| -> Vec<u8> {
        let digest = descriptor["digest"].as_str().expect("a digest");
        let bytes = read(&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")));
        assert_eq!(format!("sha256:{}", sha256_hex(&bytes)), digest, "blob digest");
        assert_eq!(
            descriptor["size"],
            Value::from(bytes.len()),
            "blob size of {digest}"
        );
        bytes
    };

    assert_eq!(
        json("oci-layout"),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    let index = json("index.json");
    let descriptors = index["manifests"].as_array().expect("manifests");
    assert_eq!(descriptors.len(), 1, "one image in {index}");
    assert_eq!(
        descriptors[0]["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let manifest: Value = serde_json::from_slice(&blob(&descriptors[0])).expect("the manifest");
    let config: Value = serde_json::from_slice(&blob(&manifest["config"])).expect("the config");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer");
    let layer_bytes = blob(&layers[0]);
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([layers[0]["digest"]]),
        "the config names the uncompressed layer"
    );
    assert_eq!(
        descriptors[0]["platform"],
        serde_json::json!({"architecture": config["architecture"], "os": "linux"})
    );

    let docker = json("manifest.json");
    assert_eq!(docker.as_array().map(Vec::len), Some(1), "one image in {docker}");
    let path_of = |descriptor: &Value| {
        format!(
            "blobs/sha256/{}",
            descriptor["digest"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("sha256:")
        )
    };
    assert_eq!(docker[0]["Config"], Value::from(path_of(&manifest["config"])));
    assert_eq!(docker[0]["Layers"], serde_json::json!([path_of(&layers[0])]));
    assert!(!layer_bytes.is_empty());
    Unpacked {
        config,
        layer: dir.join(path_of(&layers[0])),
        oci_name: descriptors[0]["annotations"]["io.containerd.image.name"].clone(),
        oci_ref: descriptors[0]["annotations"]["org.opencontainers.image.ref.name"].clone(),
        repo_tags: docker[0]["RepoTags"].clone(),
        repositories: json("repositories"),
    }
}

/// `tar -tvf LAYER`: path (without a trailing `/`) to mode and owner.
fn layer_listing(layer: &Path) -> BTreeMap<String, (String, String)> {
    let mut entries = BTreeMap::new();
    for line in text(&tar(&[
        "--numeric-owner".as_ref(),
        "-tvf".as_ref(),
        layer.as_os_str(),
    ]))
    .lines()
    {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let path = columns[5].trim_end_matches('/').to_owned();
        entries.insert(path, (columns[0].to_owned(), columns[1].to_owned()));
    }
    entries
}

fn layer_file(layer: &Path, path: &str) -> Vec<u8> {
    tar(&["-xOf".as_ref(), layer.as_os_str(), path.as_ref()])
}

#[test]
fn the_archive_is_the_image_the_dockerfiles_last_stage_defines() {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("the Dockerfile");
    let stage = last_stage(&dockerfile);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let binary = dir.path().join("redlock-operator");
    elf(&binary, false);
    let archive = dir.path().join("image.tar");
    let name = "localhost/redlock-operator:9.9.9";
    let built = image_archive(&binary, name, &archive, &[]);
    assert!(
        built.status.success(),
        "image-archive.py failed:\n{}",
        text(&built.stderr)
    );
    let unpacked_dir = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked_dir).expect("mkdir");
    let image = unpack(&archive, &unpacked_dir);

    // Named in both views, as `docker save` names it.
    assert_eq!(image.oci_name, Value::from(name));
    assert_eq!(image.oci_ref, Value::from("9.9.9"));
    assert_eq!(image.repo_tags, serde_json::json!([name]));
    assert!(
        image.repositories["localhost/redlock-operator"]["9.9.9"].is_string(),
        "{}",
        image.repositories
    );

    let config = &image.config["config"];
    assert_eq!(image.config["architecture"], "amd64");
    assert_eq!(config["User"], Value::from(stage.user.as_str()), "User");
    assert_eq!(config["Entrypoint"], stage.entrypoint, "Entrypoint");
    assert_eq!(config["Cmd"], stage.cmd, "Cmd");
    let exposed: BTreeSet<String> = config["ExposedPorts"]
        .as_object()
        .map(|ports| ports.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(exposed, stage.exposed, "ExposedPorts");
    // Every port the operator serves by default (src/cli/run.rs): metrics and health, and the reports port.
    for port in ["8080/tcp", "8443/tcp"] {
        assert!(stage.exposed.contains(port), "the Dockerfile exposes {port}");
    }
    let labels: BTreeMap<String, String> =
        serde_json::from_value(config["Labels"].clone()).unwrap_or_default();
    assert_eq!(labels, stage.labels, "Labels");
    let env: Vec<String> = serde_json::from_value(config["Env"].clone()).unwrap_or_default();
    assert!(
        env.iter().any(|e| e.starts_with("PATH=")) && stage.env.iter().all(|e| env.contains(e)),
        "Env {env:?}, the stage's {:?}",
        stage.env
    );

    // Exactly the stage's files and their parent directories, owned by root.
    let files = layer_listing(&image.layer);
    let mut expected: BTreeSet<String> = BTreeSet::new();
    for copy in &stage.copies {
        let path = copy.dest.trim_start_matches('/');
        let mut parent = String::new();
        for part in path.split('/') {
            parent = if parent.is_empty() {
                part.to_owned()
            } else {
                format!("{parent}/{part}")
            };
            expected.insert(parent.clone());
        }
    }
    assert_eq!(
        files.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "the layer's paths"
    );
    for (path, (mode, owner)) in &files {
        assert_eq!(owner, "0/0", "{path} owned by root");
        if !stage
            .copies
            .iter()
            .any(|c| c.dest.trim_start_matches('/') == path)
        {
            assert_eq!(mode, "drwxr-xr-x", "parent directory {path}");
        }
    }
    let entrypoint = stage.entrypoint[0].as_str().expect("the entrypoint's program");
    for copy in &stage.copies {
        let path = copy.dest.trim_start_matches('/');
        let (mode, _) = &files[path];
        if let Some(body) = &copy.heredoc {
            assert_eq!(
                text(&layer_file(&image.layer, path)),
                *body,
                "{path} as the Dockerfile writes it"
            );
            assert_eq!(mode, "-rw-r--r--", "{path}");
        } else if copy.dest == entrypoint {
            assert_eq!(mode, "-rwxr-xr-x", "{path} is executable");
            assert!(
                layer_file(&image.layer, path) == std::fs::read(&binary).expect("the binary"),
                "{path} is the binary given"
            );
        } else if copy.source.ends_with("/ca-certificates.crt") {
            assert_eq!(mode, "-rw-r--r--", "{path}");
            assert!(
                layer_file(&image.layer, path)
                    .windows(27)
                    .any(|w| w == b"-----BEGIN CERTIFICATE-----"),
                "{path} holds certificates"
            );
        } else {
            // A directory the build stage makes with an explicit mode (the image's /tmp).
            let made = format!("mkdir -m 1777 {}", copy.source);
            assert!(
                copy.from.is_some() && stage.earlier.contains(&made),
                "{path}: the build stage runs `{made}`"
            );
            assert_eq!(mode, "drwxrwxrwt", "{path}");
        }
    }
    // The user it runs as is in /etc/passwd and /etc/group, not root.
    let passwd = text(&layer_file(&image.layer, "etc/passwd"));
    let group = text(&layer_file(&image.layer, "etc/group"));
    let (uid, gid) = stage.user.split_once(':').expect("USER UID:GID");
    assert_ne!(uid, "0", "not root");
    assert!(
        passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(uid) && l.split(':').nth(3) == Some(gid)),
        "{passwd}"
    );
    assert!(group.lines().any(|l| l.split(':').nth(2) == Some(gid)), "{group}");

    // Reproducible: the same inputs give the same bytes.
    let again = dir.path().join("again.tar");
    let rebuilt = image_archive(&binary, name, &again, &[]);
    assert!(rebuilt.status.success(), "{}", text(&rebuilt.stderr));
    assert!(
        std::fs::read(&again).expect("read") == std::fs::read(&archive).expect("read"),
        "two builds differ"
    );
}

#[test]
fn what_the_builder_cannot_reproduce_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let binary = dir.path().join("redlock-operator");
    elf(&binary, false);
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("the Dockerfile");
    let lines = dockerfile.trim_end().lines().count();
    let out = dir.path().join("image.tar");
    for (bad, line, says) in [
        (
            format!("{}\nRUN mkdir /cache\n", dockerfile.trim_end()),
            lines + 1,
            "RUN in the last stage",
        ),
        (
            format!("{}\nCMD run\n", dockerfile.trim_end()),
            lines + 1,
            "exec form",
        ),
        (
            format!(
                "{}\nCOPY --from=build /usr/bin/env /usr/bin/env\n",
                dockerfile.trim_end()
            ),
            lines + 1,
            "no mapping",
        ),
        (
            dockerfile.replace("FROM scratch", "FROM gcr.io/distroless/static-debian12"),
            dockerfile
                .lines()
                .position(|l| l == "FROM scratch")
                .expect("FROM scratch")
                + 1,
            "must be `FROM scratch`",
        ),
    ] {
        let path = dir.path().join("Dockerfile.bad");
        std::fs::write(&path, bad).expect("write");
        let refused = image_archive(
            &binary,
            "localhost/x:1",
            &out,
            &["--dockerfile", path.to_str().expect("a UTF-8 path")],
        );
        let stderr = text(&refused.stderr);
        assert!(
            !refused.status.success(),
            "must be refused ({says}); stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("Dockerfile.bad:{line}: ")) && stderr.contains(says),
            "{stderr}"
        );
        assert!(!out.exists(), "no archive ({says})");
    }
    // A dynamically linked binary: the empty image has no libraries for it.
    let dynamic = dir.path().join("dynamic");
    elf(&dynamic, true);
    let refused = image_archive(&dynamic, "localhost/x:1", &out, &[]);
    let stderr = text(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("dynamically linked") && stderr.contains("crt-static"),
        "{stderr}"
    );
    assert!(!out.exists(), "no archive of a dynamic binary");
}

/// scripts/build-images.sh builds the operator image with the same builder, needing neither the k8s-node kit nor
/// root; an unchanged tar is kept.
#[test]
fn build_images_builds_the_operator_image_without_the_kit() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let binary = dir.path().join("redlock-operator");
    elf(&binary, false);
    let out = dir.path().join("images");
    let run = || {
        Command::new(Path::new(ROOT).join("scripts/build-images.sh"))
            .arg(&out)
            .args(["--only", "operator", "--binary"])
            .arg(&binary)
            .env("K8S_NODE_KIT", dir.path().join("no-kit"))
            .output()
            .expect("scripts/build-images.sh runs")
    };
    let built = run();
    assert!(
        built.status.success(),
        "build-images.sh failed:\n{}",
        text(&built.stderr)
    );
    assert_eq!(
        text(&built.stdout),
        "--set image.repository=localhost/redlock-operator\n--set image.tag=e2e\n",
        "stdout is the helm flags for the image"
    );
    let archive = out.join("redlock-operator.tar");
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    let image = unpack(&archive, &unpacked);
    assert_eq!(
        image.repo_tags,
        serde_json::json!(["localhost/redlock-operator:e2e"])
    );
    let before = std::fs::metadata(&archive)
        .and_then(|m| m.modified())
        .expect("mtime");
    let again = run();
    assert!(again.status.success(), "second run:\n{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("is up to date"),
        "second run:\n{}",
        text(&again.stderr)
    );
    assert_eq!(
        std::fs::metadata(&archive)
            .and_then(|m| m.modified())
            .expect("mtime"),
        before,
        "tar untouched"
    );
}

/// The crate, the chart and the image share the version (scripts/release.sh names the binary, the image archive
/// and the packaged chart after it, and refuses to run when they differ), and the chart's default image is the
/// one the release archive holds (release.sh names it after the chart's `image.repository`): a name under
/// localhost/ (never pulled from a public registry by mistake) tagged with the chart's appVersion.
#[test]
fn crate_chart_and_image_share_the_version() {
    let read_yaml = |path: &str| -> serde_json::Value {
        let text =
            std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let chart = read_yaml("charts/redlock-operator/Chart.yaml");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        chart["version"],
        Value::from(version),
        "Chart.yaml version = Cargo.toml version"
    );
    assert_eq!(
        chart["appVersion"],
        Value::from(version),
        "Chart.yaml appVersion = Cargo.toml version"
    );
    let values = read_yaml("charts/redlock-operator/values.yaml");
    assert_eq!(values["image"]["repository"], "localhost/redlock-operator");
    assert_eq!(values["image"]["tag"], "", "the tag defaults to the appVersion");
}
