//! `ebbflow-runtime`: the coordinator, node and single-process modes of the AgileML runtime
//! (the command line lives in [`ebbflow_runtime::cli`], which the Python SDK runs too).

fn main() -> anyhow::Result<()> {
    ebbflow_runtime::cli::main_with(std::env::args_os(), &ebbflow_runtime::cli::BuiltinApps)
}
