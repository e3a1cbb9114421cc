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
    Simulate(Box<ebbflow_operator::sim::cli::SimulateArgs>),
    /// Train a TrainingJob on this machine against a replayed spot market.
    Run(Box<ebbflow_operator::run::RunArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ebbflow_crds::crd_yaml()?);
        }
        Command::Simulate(args) => {
            print!("{}", ebbflow_operator::sim::cli::run(&args)?);
        }
        Command::Run(args) => {
            let summary = ebbflow_operator::run::run(&args)?;
            print!("{}", summary.text());
        }
    }
    Ok(())
}
