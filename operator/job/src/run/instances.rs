//! How the instances of `ebbflow run` run: what "buy an instance", "the cloud takes it back in T"
//! and "it is gone" mean on one machine. [`super::provisioner::LocalProvisioner`] decides what
//! to launch and release (the operator's plan) and passes it on to these, with the market's
//! notices and evictions.
//!
//! - [`NodeProcesses`] (the default): every instance is an `ebbflow node` process on 127.0.0.1
//!   that joins the job's coordinator over its admin API. A notice is posted to the coordinator
//!   the way the operator posts one (`POST /notice` with the deadline); at the deadline a process
//!   still running is killed, like an instance EC2 reclaims. An eviction without notice kills it
//!   at once.
//! - [`NodeThreads`] (`--in-process`): every instance is a set of threads of this process; events
//!   go straight to the controller.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime};

use ebbflow_runtime::elastic::ElasticEvent;
use ebbflow_runtime::notices::NoticeError;

/// What happens to the instances of a local run.
pub trait Instances {
    /// Transient instances were bought.
    fn launch(&mut self, names: Vec<String>);
    /// Instances will be taken away `lead` from now (or we release them ourselves).
    fn notice(&mut self, names: Vec<String>, lead: Duration);
    /// Instances are gone without notice.
    fn evict(&mut self, names: Vec<String>);
    /// Called on every tick of the replay: enforces deadlines and reaps exits.
    fn tick(&mut self) {}
}

/// Instances as threads of this process.
pub struct NodeThreads {
    /// The controller's feed.
    pub events: Sender<ElasticEvent>,
}

impl Instances for NodeThreads {
    fn launch(&mut self, names: Vec<String>) {
        let _ = self.events.send(ElasticEvent::Join { names });
    }

    fn notice(&mut self, names: Vec<String>, lead: Duration) {
        let _ = self.events.send(ElasticEvent::Notice { names, lead });
    }

    fn evict(&mut self, names: Vec<String>) {
        let _ = self.events.send(ElasticEvent::Fail { names });
    }
}

/// glibc's malloc settings for a node process, unless `GLIBC_TUNABLES` is set already: a fixed
/// mmap threshold of 128 KiB. By default glibc raises the threshold to the size of each large
/// block freed (up to 32 MiB), after which a node's megabyte blocks (allocated and freed on the
/// transport's threads) come from per-thread arenas that keep the freed space. With a fixed threshold those blocks are mapped and unmapped and the memory goes back
/// to the system: at 25 M ratings a node peaks at 281 MiB with it and 352 MiB without, at about
/// 0.3 s more system time over 192 clocks (issue 36, `scripts/bench-mf-nodes.sh
/// --glibc-default`). The runtime images set the same value (`Dockerfile`,
/// `scripts/oci-image.py`).
pub const NODE_MALLOC_TUNABLES: &str = "glibc.malloc.mmap_threshold=131072";

/// How to start one node process.
#[derive(Debug, Clone)]
pub struct NodeCommand {
    /// The `ebbflow` executable.
    pub exe: PathBuf,
    /// The manifest.
    pub manifest: PathBuf,
    /// Dataset directory passed on.
    pub data_dir: Option<PathBuf>,
    /// The coordinator's admin URL.
    pub coordinator: String,
    /// The job secret (passed in the environment, never on the command line).
    pub secret: String,
    /// Where each node's log goes (`<name>.log`).
    pub log_dir: PathBuf,
}

impl NodeCommand {
    /// Starts node `name`.
    pub fn spawn(&self, name: &str, transient: bool) -> std::io::Result<Child> {
        let log = std::fs::File::create(self.log_dir.join(format!("{name}.log")))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("node")
            .arg(&self.manifest)
            .args(["--coordinator", &self.coordinator, "--name", name])
            .env("EBBFLOW_JOB_SECRET", &self.secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(dir) = &self.data_dir {
            command.arg("--data-dir").arg(dir);
        }
        if transient {
            command.arg("--transient");
        }
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            command.env("GLIBC_TUNABLES", NODE_MALLOC_TUNABLES);
        }
        // Its own process group: Ctrl-C in the terminal reaches `ebbflow run`, which stops the
        // job at a boundary and releases every node, instead of killing the nodes under it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.spawn()
    }
}

/// Instances as node processes (see the module docs). Dropping it kills every process still
/// running: a run leaves no orphans.
pub struct NodeProcesses {
    command: NodeCommand,
    children: BTreeMap<String, Child>,
    deadlines: BTreeMap<String, Instant>,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    /// Processes that could not be started or notified (reported at the end).
    pub problems: Vec<String>,
}

impl NodeProcesses {
    /// No instance yet.
    pub fn new(command: NodeCommand) -> std::io::Result<Self> {
        std::fs::create_dir_all(&command.log_dir)?;
        let http =
            ebbflow_runtime::admin::client_for_url(&command.coordinator, command.secret.as_bytes())
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(std::io::Error::other)?;
        Ok(Self {
            command,
            children: BTreeMap::new(),
            deadlines: BTreeMap::new(),
            http,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            problems: Vec::new(),
        })
    }

    /// Starts a reliable (on-demand) instance.
    pub fn launch_reliable(&mut self, name: &str) -> std::io::Result<()> {
        let child = self.command.spawn(name, false)?;
        self.children.insert(name.to_owned(), child);
        Ok(())
    }

    /// Instances whose process is running.
    pub fn running(&self) -> usize {
        self.children.len()
    }

    fn kill(&mut self, name: &str) {
        if let Some(mut child) = self.children.remove(name) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.deadlines.remove(name);
    }
}

impl Instances for NodeProcesses {
    fn launch(&mut self, names: Vec<String>) {
        for name in names {
            match self.command.spawn(&name, true) {
                Ok(child) => {
                    self.children.insert(name, child);
                }
                Err(error) => self
                    .problems
                    .push(format!("starting node {name} failed: {error}")),
            }
        }
    }

    fn notice(&mut self, names: Vec<String>, lead: Duration) {
        let deadline = SystemTime::now() + lead;
        for name in names {
            if !self.children.contains_key(&name) {
                continue;
            }
            let sent = self.rt.block_on(ebbflow_runtime::notices::send_notice_at(
                &self.http,
                &self.command.coordinator,
                &self.command.secret,
                &name,
                deadline,
            ));
            match sent {
                Ok(_) => {}
                // The coordinator does not know the node: it has not joined yet (its process is
                // still starting), so it holds nothing and goes now. Before, it joined after the
                // lost notice and stayed a member until its deadline, which for an instance the
                // bidder released is an hour: a replayed market that replaces instances faster
                // than they start (BidBrain at 12,000x) piled up hundreds of node processes.
                Err(NoticeError::Status { status: 404, .. }) => {
                    tracing::info!(%name, "notice for an instance that has not joined: stopped now");
                    self.kill(&name);
                    continue;
                }
                Err(error) => tracing::warn!(%name, %error, "notice not delivered"),
            }
            self.deadlines.insert(name, Instant::now() + lead);
        }
    }

    fn evict(&mut self, names: Vec<String>) {
        for name in names {
            self.kill(&name);
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .deadlines
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            self.kill(&name);
        }
        let exited: Vec<String> = self
            .children
            .iter_mut()
            .filter_map(|(name, child)| match child.try_wait() {
                Ok(Some(_)) => Some(name.clone()),
                _ => None,
            })
            .collect();
        for name in exited {
            self.children.remove(&name);
            self.deadlines.remove(&name);
        }
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        // Released nodes exit on their own; give them a moment, then kill the rest.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until
            && self
                .children
                .values_mut()
                .any(|c| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let names: Vec<String> = self.children.keys().cloned().collect();
        for name in names {
            self.kill(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebbflow_runtime::elastic_coordinator::{ElasticService, router};
    use ebbflow_runtime::heartbeat::Heartbeats;
    use ebbflow_runtime::metrics::RuntimeMetrics;
    use std::sync::Arc;

    /// An instance whose process is still starting: it never joins.
    fn starting_instance(dir: &std::path::Path) -> PathBuf {
        script(dir, "starting-node", "exec sleep 600")
    }

    /// An executable shell script `name` in `dir`.
    fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
        let exe = dir.join(name);
        std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mut permissions = std::fs::metadata(&exe).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&exe, permissions).unwrap();
        exe
    }

    /// The bidder releases (or the market interrupts) an instance that has not joined the job
    /// yet: the coordinator does not know it, so the notice cannot reach it and it would join
    /// later and stay a member until its deadline (an hour for a release). It holds nothing, so
    /// its process is stopped at once.
    #[test]
    fn a_notice_for_an_instance_that_has_not_joined_stops_it_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // The real admin API of a job nobody joined.
        let service = ElasticService::new(
            "secret".into(),
            "exact/1".into(),
            1,
            Arc::default(),
            prometheus::Registry::new(),
            RuntimeMetrics::unregistered(),
            Arc::new(Heartbeats::unregistered(Duration::from_secs(60))),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move { axum::serve(listener, router(service)).await });
        let mut instances = NodeProcesses::new(NodeCommand {
            exe: starting_instance(dir.path()),
            manifest: dir.path().join("job.yaml"),
            data_dir: None,
            coordinator: format!("http://{addr}"),
            secret: "secret".into(),
            log_dir: dir.path().join("logs"),
        })
        .unwrap();
        instances.launch(vec!["t0".into(), "t1".into()]);
        assert_eq!(instances.running(), 2, "{:?}", instances.problems);
        instances.notice(vec!["t0".into()], super::super::provisioner::RELEASE_LEAD);
        assert_eq!(instances.running(), 1, "t0 stopped at once, t1 runs on");
        instances.tick();
        assert_eq!(instances.running(), 1);
    }

    /// A node process gets the malloc settings that keep its memory near its heap (unless the
    /// caller chose its own), and its secret in the environment.
    #[test]
    fn a_node_process_starts_with_the_malloc_settings_and_its_secret() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let body = format!(
            "printf '%s %s' \"$GLIBC_TUNABLES\" \"$EBBFLOW_JOB_SECRET\" > {}",
            seen.display()
        );
        let exe = script(dir.path(), "node", &body);
        let command = NodeCommand {
            exe,
            manifest: dir.path().join("job.yaml"),
            data_dir: None,
            coordinator: "http://127.0.0.1:1".into(),
            secret: "s3cret".into(),
            log_dir: dir.path().to_path_buf(),
        };
        let status = command.spawn("n0", false).unwrap().wait().unwrap();
        assert!(status.success());
        let tunables =
            std::env::var("GLIBC_TUNABLES").unwrap_or_else(|_| NODE_MALLOC_TUNABLES.into());
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap(),
            format!("{tunables} s3cret")
        );
    }
}
