//! `ebbflow`: the user CLI (`crd`, `simulate`, `run`).

use clap::{Parser, Subcommand};

/// ebbflow: ML training on cheap, revocable cloud capacity.
#[derive(Parser)]
#[command(name = "ebbflow", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the TrainingJob CustomResourceDefinition as YAML.
    Crd,
    /// Replay a spot trace from many random start times and compare bidding strategies.
    Simulate(Box<ebbflow_bidbrain::sim::cli::SimulateArgs>),
    /// Train a TrainingJob on this machine against a replayed spot market.
    Run(Box<ebbflow_job::run::RunArgs>),
    /// One instance of an `ebbflow run` (started by it).
    #[command(hide = true)]
    Node(Box<ebbflow_job::run::NodeArgs>),
    /// A runtime pod of a TrainingJob (the operator's pods run it; configured by their
    /// environment, see operator/job/src/run/pod.rs).
    Pod,
}

fn init_node_logs() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .compact()
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ebbflow_crds::crd_yaml()?);
        }
        Command::Simulate(args) => {
            print!("{}", ebbflow_bidbrain::sim::cli::run(&args)?);
        }
        Command::Run(args) => {
            // The run's own progress goes to the terminal; its runtime's logs (the in-process
            // instances' servers and workers) only when asked for with RUST_LOG.
            if std::env::var_os("RUST_LOG").is_some() {
                init_node_logs();
            }
            let summary = ebbflow_job::run::run(&args)?;
            print!("{}", summary.text());
        }
        Command::Node(args) => {
            init_node_logs();
            ebbflow_job::run::node(&args)?;
        }
        Command::Pod => {
            init_node_logs();
            let env = ebbflow_job::run::pod::PodEnv::read(|name| std::env::var(name).ok())?;
            if let Some(report) = ebbflow_job::run::pod::pod(&env)? {
                println!("{report}");
            }
        }
    }
    Ok(())
}
