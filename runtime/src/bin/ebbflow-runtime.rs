//! `ebbflow-runtime`: coordinator and node processes.

fn main() -> anyhow::Result<()> {
    Ok(())
}
