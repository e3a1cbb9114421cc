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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ebbflow_crds::crd_yaml()?);
        }
    }
    Ok(())
}
