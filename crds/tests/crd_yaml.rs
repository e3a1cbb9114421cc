//! The committed CRD YAML is what the types generate.

use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

#[test]
fn committed_crd_yaml_matches_the_types() {
    let generated = ebbflow_crds::crd_yaml().expect("crd serializes");
    let path = repo_root().join(ebbflow_crds::CRD_YAML_PATH);
    if std::env::var_os("EBBFLOW_UPDATE_CRD").is_some() {
        std::fs::write(&path, &generated).expect("write crd yaml");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the TrainingJob types; regenerate it with:\n  {}",
        ebbflow_crds::CRD_YAML_PATH,
        ebbflow_crds::REGENERATE_COMMAND
    );
}
