//! Writes the fuzzer's starting inputs ([`ebbflow_runtime::fuzzing::seeds`]) under the directory
//! given, one folder per target.
fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "seeds".into()));
    for (target, name, bytes) in ebbflow_runtime::fuzzing::seeds() {
        let folder = dir.join(target);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join(name), bytes)?;
    }
    Ok(())
}
