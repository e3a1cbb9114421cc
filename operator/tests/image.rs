//! The container images `scripts/oci-image.py` builds without a container engine, checked from
//! the outside: the archives are valid OCI image layouts (every blob's digest and size as the
//! manifest and index say, the config's diff ids those of the layers), the same binaries give
//! the same digests, and the runtime image's file system, unpacked layer by layer, runs
//! `ebbflow` as the pods' nonroot user: a BidBrain simulation on the shared p3 trace, in the
//! image's `/tmp`. The operator image's binary runs there too.
//!
//! Uses this package's own binaries (the test build's; the release images are built from the
//! release ones the same way). The run inside the image needs root for `chroot`; without it
//! that part is skipped with a line saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `ebbflow` binary of this test build: crate ebbflow-job's, which `cargo test --workspace`
/// builds beside this package's (for the job crate's own integration tests).
fn ebbflow_bin() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_ebbflow-operator")).with_file_name("ebbflow");
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build -p ebbflow-job --bin ebbflow`)",
        path.display()
    );
    path
}

fn build_images(out: &Path) -> String {
    let ebbflow = ebbflow_bin();
    let bin_dir = ebbflow.parent().unwrap();
    run(Command::new("python3")
        .arg(repo().join("scripts/oci-image.py"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out)
        .args(["--tag", "test", "--no-compress"]))
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    format!("sha256:{}", out.split_whitespace().next().unwrap())
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Checks a descriptor's blob: its digest and size.
fn check_descriptor(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    let path = blob(layout, digest);
    assert_eq!(sha256(&path), digest, "{}", path.display());
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        descriptor["size"].as_u64().unwrap(),
        "{digest}"
    );
    path
}

/// Unpacks the OCI archive `archive`, checks it, and returns (manifest digest, image config,
/// the unpacked file system).
fn unpack(archive: &Path, into: &Path) -> (String, Value, PathBuf) {
    let layout = into.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    assert_eq!(
        read_json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = read_json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        "test"
    );
    let manifest = read_json(&check_descriptor(&layout, &manifests[0]));
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let config = read_json(&check_descriptor(&layout, &manifest["config"]));
    let root = into.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len());
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar");
        let path = check_descriptor(&layout, layer);
        // uncompressed: the diff id is the layer's own digest
        assert_eq!(layer["digest"], *diff_id);
        run(Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(&root)
            .arg("--no-same-owner"));
    }
    (
        manifests[0]["digest"].as_str().unwrap().to_owned(),
        config,
        root,
    )
}

fn is_root() -> bool {
    run(Command::new("id").arg("-u")).trim() == "0"
}

/// Copies the shared p3 trace and the price lists beside it into the image at `root`'s
/// /tmp/spot; returns the trace's path inside the image.
fn copy_spot_data(root: &Path) -> String {
    let data = std::env::var_os("EBBFLOW_SPOT_DATA")
        .map_or_else(|| repo().join("../shared/data/spot"), PathBuf::from);
    let trace = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";
    std::fs::create_dir(root.join("tmp/spot")).unwrap();
    for file in [
        trace,
        "aws_on_demand_prices_us-east-1.csv",
        "aws_instance_specs.csv",
    ] {
        std::fs::copy(data.join(file), root.join("tmp/spot").join(file))
            .unwrap_or_else(|e| panic!("{}: {e}", data.join(file).display()));
    }
    format!("/tmp/spot/{trace}")
}

/// Runs `args` inside `root` as the pods' user (65532).
fn in_image(root: &Path, args: &[&str]) -> String {
    run(Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", "/home/nonroot"))
}

#[test]
fn the_images_are_valid_reproducible_and_run_as_nonroot() {
    let dir = tempfile::tempdir().unwrap();
    let printed = build_images(&dir.path().join("a"));
    println!("{printed}");
    let again = build_images(&dir.path().join("b"));
    let digests = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(".oci.tar"))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .collect()
    };
    assert_eq!(digests(&printed).len(), 2, "{printed}");
    assert_eq!(digests(&printed), digests(&again), "reproducible");

    let runtime = dir.path().join("a/ebbflow-runtime-test.oci.tar");
    let (digest, config, root) = unpack(&runtime, &dir.path().join("runtime"));
    assert_eq!(digests(&printed)[1], digest);
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Cmd"],
        serde_json::json!(["ebbflow", "pod"])
    );
    assert!(root.join("usr/local/bin/ebbflow").exists());
    assert!(root.join("etc/passwd").exists());

    let operator = dir.path().join("a/ebbflow-operator-test.oci.tar");
    let (_, operator_config, operator_root) = unpack(&operator, &dir.path().join("operator"));
    assert_eq!(
        operator_config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/ebbflow-operator"])
    );

    if !is_root() {
        println!("not root: the run inside the images (chroot) is skipped");
        return;
    }
    // The runtime image runs ebbflow as nonroot: a BidBrain simulation of the p3 trace,
    // written to the image's /tmp.
    let trace = copy_spot_data(&root);
    let out = in_image(
        &root,
        &[
            "ebbflow", "simulate", "--trace", &trace, "--starts", "20", "--out", "/tmp/sim",
        ],
    );
    assert!(out.contains("BidBrain + AgileML"), "{out}");
    let csv = root.join("tmp/sim");
    let written: Vec<_> = std::fs::read_dir(&csv)
        .unwrap_or_else(|e| panic!("{}: {e}\n{out}", csv.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        written.iter().any(|name| name.ends_with(".csv")),
        "{written:?}"
    );
    // The operator image's binary runs there too.
    let help = in_image(
        &operator_root,
        &["/usr/local/bin/ebbflow-operator", "--help"],
    );
    assert!(help.contains("--runtime-image"), "{help}");
    println!(
        "inside the runtime image as 65532: ebbflow simulate wrote {written:?}; the operator image's binary answers --help"
    );
}

/// The Python runtime image (`oci-image.py --python-bin`), from this test build's `ebbflow` when
/// it has the python feature (scripts/test.sh builds it so) and a Python with numpy
/// (`EBBFLOW_PYTHON`, the test venv): `ebbflow run` of the SDK's integer-exact app inside it, as
/// the pods' nonroot user with nothing but the image's own CPython, numpy and SDK, ends exact.
#[test]
fn the_python_image_runs_a_python_app_as_nonroot() {
    let ebbflow = &ebbflow_bin();
    let ldd = run(Command::new("ldd").arg(ebbflow));
    let python = std::env::var_os("EBBFLOW_PYTHON").filter(|p| !p.is_empty());
    let (true, Some(python)) = (ldd.contains("libpython3"), python) else {
        println!(
            "skipped: needs ebbflow built with --features python and EBBFLOW_PYTHON (a Python with numpy)"
        );
        return;
    };
    let site_packages = run(Command::new(&python).args([
        "-c",
        "import os, numpy; print(os.path.dirname(os.path.dirname(numpy.__file__)))",
    ]));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("images");
    let printed = run(Command::new("python3")
        .arg(repo().join("scripts/oci-image.py"))
        .arg("--python-bin")
        .arg(ebbflow)
        .args(["--site-packages", site_packages.trim()])
        .arg("--sdk")
        .arg(repo().join("python/ebbflow"))
        .arg("--examples")
        .arg(repo().join("examples/python"))
        .arg("--out")
        .arg(&out)
        .args(["--tag", "test", "--no-compress"]));
    println!("{printed}");
    let (_, config, root) = unpack(
        &out.join("ebbflow-runtime-python-test.oci.tar"),
        &dir.path().join("python"),
    );
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Cmd"],
        serde_json::json!(["ebbflow", "pod"])
    );
    assert!(root.join("opt/ebbflow/python/ebbflow/__init__.py").exists());
    assert!(root.join("opt/ebbflow/python/numpy").is_dir());
    assert!(root.join("opt/ebbflow/examples/exact.py").exists());
    if !is_root() {
        println!("not root: the run inside the Python image (chroot) is skipped");
        return;
    }
    // A Python job on a replayed market.
    let trace = copy_spot_data(&root);
    let manifest = format!(
        r#"apiVersion: ebbflow.dev/v1alpha1
kind: TrainingJob
metadata: {{name: python-image}}
spec:
  app:
    kind: Python
    python:
      entry: exact:App
      path: [/opt/ebbflow/examples]
      args: {{clocks: 200, staleness: 1, clock_ms: 5}}
    dataset: {{path: /opt/ebbflow/examples/exact.py, format: raw}}
  consistency: {{model: SSP, staleness: 1}}
  stop: {{iterations: 200}}
  reliable: {{count: 1}}
  transient: {{minNodes: 1, maxNodes: 2}}
  bidding:
    strategy: BidBrain
    market: {{kind: trace, trace: {trace}}}
    billingModel: aws
    budgetPerHour: 15
  elasticity: {{partitions: 4}}
  runtime: {{workerThreads: 1}}
"#
    );
    std::fs::write(root.join("tmp/job.yaml"), manifest).unwrap();
    let env: Vec<(String, String)> = config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let output = run(Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(&root)
        .args([
            "ebbflow",
            "run",
            "/tmp/job.yaml",
            "--quiet",
            // instances as threads: a chroot has no /proc for `ebbflow node` processes to
            // find the executable by (a pod has)
            "--in-process",
            "--out",
            "/tmp/run",
        ])
        .env_clear()
        .envs(env)
        // the host's chroot is found on it too
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", "/home/nonroot"));
    let summary: Value =
        serde_json::from_slice(&std::fs::read(root.join("tmp/run/summary.json")).unwrap())
            .unwrap_or_else(|e| panic!("summary.json: {e}\n{output}"));
    assert_eq!(
        summary["quality"]["wrong_values"], 0.0,
        "the Python exact app inside the image: {summary}\n{output}"
    );
    println!(
        "inside the Python image as 65532: ebbflow run of exact:App ended exact: {}",
        summary["quality"]
    );
}
