//! Replays every input the fuzzer found a bug with (`fuzz/regressions/<target>/*`, see
//! `scripts/fuzz.sh`) and every seed through the fuzzing entry points: each must now run clean.

use std::path::Path;

use ebbflow_runtime::fuzzing;

#[test]
fn every_fuzzing_regression_and_seed_runs_clean() {
    let rt = fuzzing::runtime();
    let run = |target: &str, name: &str, bytes: &[u8]| {
        eprintln!("{target}/{name}: {} bytes", bytes.len());
        match target {
            "frames" => fuzzing::frames(bytes),
            "connection" => {
                fuzzing::connection(&rt, bytes);
            }
            "admin" => {
                fuzzing::admin(&rt, bytes);
            }
            other => panic!("{name}: no fuzz target {other}"),
        }
    };
    let mut replayed = 0;
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    for target in std::fs::read_dir(&regressions).unwrap() {
        let target = target.unwrap().path();
        if !target.is_dir() {
            continue;
        }
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        for input in std::fs::read_dir(&target).unwrap() {
            let input = input.unwrap().path();
            run(
                &name,
                &input.file_name().unwrap().to_string_lossy(),
                &std::fs::read(&input).unwrap(),
            );
            replayed += 1;
        }
    }
    for (target, name, bytes) in fuzzing::seeds() {
        run(target, &name, &bytes);
        replayed += 1;
    }
    assert!(replayed > 30, "replayed {replayed} inputs");
}
