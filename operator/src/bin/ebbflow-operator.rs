//! `ebbflow-operator`: the Kubernetes controller.

fn main() -> anyhow::Result<()> {
    Ok(())
}
