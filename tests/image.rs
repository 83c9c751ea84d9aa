//! The operator image that scripts/build-images.sh builds without a container daemon (with the k8s-node kit's
//! mk-image.sh) is the one the Dockerfile's runtime stage defines: its user, entrypoint, command, exposed ports and
//! labels, and the binary at the path the stage copies it to. The stage is read here on its own, not by the script's
//! parser. An instruction the script cannot map is refused. Without the kit (`../shared/k8s-node`, or
//! `K8S_NODE_KIT`) the tests say so and pass: the image cannot be built there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_redlock-operator");

/// Whether the k8s-node kit is there; says why not when it is not.
fn kit_present(test: &str) -> bool {
    let kit = std::env::var_os("K8S_NODE_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(ROOT).join("../shared/k8s-node"));
    let present = kit.join("mk-image.sh").is_file();
    if !present {
        eprintln!(
            "{test}: skipped: no k8s-node kit at {} (mk-image.sh); set K8S_NODE_KIT",
            kit.display()
        );
    }
    present
}

/// scripts/build-images.sh OUT --only operator --binary <the debug binary> EXTRA...
fn build_images(out: &Path, extra: &[&str]) -> Output {
    Command::new(Path::new(ROOT).join("scripts/build-images.sh"))
        .arg(out)
        .args(["--only", "operator", "--binary", BINARY])
        .args(extra)
        .output()
        .expect("scripts/build-images.sh runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `tar ARGS...`'s stdout; it must succeed.
fn tar(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let out = Command::new("tar").args(args).output().expect("tar runs");
    assert!(out.status.success(), "tar {args:?}: {}", text(&out.stderr));
    out.stdout
}

/// What the Dockerfile's runtime stage (after its last FROM) sets.
#[derive(Debug, Default)]
struct RuntimeStage {
    user: String,
    entrypoint: Value,
    cmd: Value,
    exposed: BTreeSet<String>,
    labels: BTreeMap<String, String>,
    binary_path: String,
}

/// Instructions with continuation lines joined and comment lines dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut all = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                all.push(std::mem::take(&mut current).trim().to_owned());
            }
        }
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

fn runtime_stage(dockerfile: &str) -> RuntimeStage {
    let all = instructions(dockerfile);
    let last_from = all
        .iter()
        .rposition(|i| i.to_uppercase().starts_with("FROM "))
        .expect("a FROM");
    let mut stage = RuntimeStage::default();
    for instruction in &all[last_from + 1..] {
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
            "COPY" => {
                let paths: Vec<String> = words(rest).into_iter().filter(|w| !w.starts_with("--")).collect();
                let [source, dest] = paths.as_slice() else {
                    panic!("COPY SRC DEST, got {rest}")
                };
                stage.binary_path = match dest.strip_suffix('/') {
                    Some(dir) => format!("{dir}/{}", source.rsplit('/').next().unwrap_or(source)),
                    None => dest.clone(),
                };
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
            other => panic!("this test does not read {other} in the runtime stage yet: teach it"),
        }
    }
    stage
}

/// Unpacks the docker-archive TAR into DIR: its manifest, its config and the path of its one layer.
fn unpack(archive: &Path, dir: &Path) -> (Value, Value, PathBuf) {
    tar(&[
        "-xf".as_ref(),
        archive.as_os_str(),
        "-C".as_ref(),
        dir.as_os_str(),
    ]);
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).expect(name)).expect("JSON")
    };
    let manifest = read("manifest.json");
    assert_eq!(
        manifest.as_array().map(Vec::len),
        Some(1),
        "one image in {manifest}"
    );
    let config = read(manifest[0]["Config"].as_str().expect("Config"));
    let layers = manifest[0]["Layers"].as_array().expect("Layers");
    assert_eq!(layers.len(), 1, "mk-image.sh writes one layer");
    let layer = dir.join(layers[0].as_str().expect("a layer path"));
    (manifest, config, layer)
}

/// `tar -tvf LAYER`: path (without `./`) to mode.
fn layer_listing(layer: &Path) -> BTreeMap<String, String> {
    let mut entries = BTreeMap::new();
    for line in text(&tar(&["-tvf".as_ref(), layer.as_os_str()])).lines() {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let path = columns[5]
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        entries.insert(path, columns[0].to_owned());
    }
    entries
}

#[test]
fn the_operator_image_is_what_the_dockerfiles_runtime_stage_says() {
    if !kit_present("the_operator_image_is_what_the_dockerfiles_runtime_stage_says") {
        return;
    }
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("the Dockerfile");
    let stage = runtime_stage(&dockerfile);
    assert!(
        !stage.binary_path.is_empty() && !stage.user.is_empty(),
        "the stage read: {stage:?}"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("images");
    let built = build_images(&out, &[]);
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
    let (manifest, config, layer) = unpack(&archive, &unpacked);
    assert_eq!(
        manifest[0]["RepoTags"],
        serde_json::json!(["localhost/redlock-operator:e2e"])
    );

    let image = &config["config"];
    assert_eq!(image["User"], Value::from(stage.user.as_str()), "User");
    assert_eq!(image["Entrypoint"], stage.entrypoint, "Entrypoint");
    assert_eq!(image["Cmd"], stage.cmd, "Cmd");
    let exposed: BTreeSet<String> = image["ExposedPorts"]
        .as_object()
        .map(|ports| ports.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(exposed, stage.exposed, "ExposedPorts");
    let labels: BTreeMap<String, String> =
        serde_json::from_value(image["Labels"].clone()).unwrap_or_default();
    assert_eq!(labels, stage.labels, "Labels");

    // The binary, where the stage copies it, executable and the very file built; what distroless/cc brings.
    let files = layer_listing(&layer);
    let binary = stage.binary_path.trim_start_matches('/');
    let mode = files
        .get(binary)
        .unwrap_or_else(|| panic!("{binary} in the layer: {files:?}"));
    assert_eq!(mode, "-rwxr-xr-x", "{binary} is executable");
    let layer_file = |path: &str| tar(&["-xOf".as_ref(), layer.as_os_str(), format!("./{path}").as_ref()]);
    assert!(
        layer_file(binary) == std::fs::read(BINARY).expect("the binary"),
        "{binary} is the binary given"
    );
    for file in ["etc/ssl/certs/ca-certificates.crt", "home/nonroot", "tmp"] {
        assert!(files.contains_key(file), "{file} in the layer");
    }
    // glibc and libgcc, as the binary links them (a Linux GNU target, as distroless/cc is glibc).
    for library in ["/libc.so.6", "/libgcc_s.so.1"] {
        assert!(
            files.keys().any(|f| f.ends_with(library)),
            "{library} in the layer"
        );
    }
    let passwd = text(&layer_file("etc/passwd"));
    assert!(
        passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")),
        "distroless's nonroot: {passwd}"
    );

    // Nothing changed: the tar is kept as it is.
    let before = std::fs::metadata(&archive)
        .and_then(|m| m.modified())
        .expect("mtime");
    let again = build_images(&out, &[]);
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

#[test]
fn an_instruction_the_script_cannot_map_in_the_runtime_stage_is_refused() {
    if !kit_present("an_instruction_the_script_cannot_map_in_the_runtime_stage_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("the Dockerfile");
    // RUN in the build stage is fine (it is not the image); in the runtime stage it has no mapping.
    for (extra, says) in [
        ("RUN mkdir /cache", "RUN in the runtime stage"),
        ("CMD run", "exec form"),
    ] {
        let bad = dir.path().join("Dockerfile.bad");
        std::fs::write(&bad, format!("{}\n{extra}\n", dockerfile.trim_end())).expect("write");
        let line = dockerfile.trim_end().lines().count() + 1;
        let out = dir.path().join("images");
        let refused = build_images(&out, &["--dockerfile", bad.to_str().expect("a UTF-8 path")]);
        let stderr = text(&refused.stderr);
        assert!(
            !refused.status.success(),
            "`{extra}` must be refused; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("Dockerfile.bad:{line}: ")) && stderr.contains(says),
            "{stderr}"
        );
        assert!(
            !out.join("redlock-operator.tar").exists(),
            "no image for `{extra}`"
        );
        assert!(refused.stdout.is_empty(), "no helm flags for `{extra}`");
    }
}
