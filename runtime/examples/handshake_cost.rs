//! What TLS adds to opening a data-plane connection (issue 38: "the handshake adds at most a few
//! milliseconds to a join"): one server on 127.0.0.1 with transport security `none` and one with
//! `tls`, and `ROUNDS` connections to each, alternating, each opened, authenticated (the HMAC
//! handshake, inside TLS for the second) and answered once (a `Warm` of 0 bytes) before it is
//! closed. Prints the median and 90th percentile of each and the difference of the medians.
//! Then the same for the coordinator's admin API (the real router, served plain and over TLS):
//! `ROUNDS` `GET /status` calls each, every one on a new connection, as a node's first call of a
//! join opens one.
//!
//!     cargo run --release -p ebbflow-runtime --example handshake_cost [ROUNDS]

use std::time::{Duration, Instant};

use ebbflow_runtime::client::{ClientConfig, Connection};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::ServerHandle;
use ebbflow_runtime::tls::{JobTls, TransportSecurity};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(text) => text
            .parse()
            .map_err(|_| format!("ROUNDS must be a count of connections, not {text:?}"))?,
        None => 500,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let secret = ebbflow_runtime::node::random_secret();
    let metrics = RuntimeMetrics::unregistered();
    let mut sides = Vec::new();
    for security in [TransportSecurity::None, TransportSecurity::Tls] {
        let tls = JobTls::for_security(security, secret.as_bytes());
        let server = ServerHandle::loopback(
            runtime.handle(),
            ebbflow_runtime::fuzzing::one_table(false),
            secret.as_bytes(),
            tls.clone(),
            Duration::from_secs(10),
            &metrics,
        )?;
        let client = ClientConfig {
            secret: secret.as_bytes().to_vec(),
            node: 1,
            max_frame_bytes: 1 << 20,
            timeout: Duration::from_secs(10),
            tls,
        };
        sides.push((security, server, client, Vec::with_capacity(rounds)));
    }
    // One unmeasured connection each: the first pays for code and key set-up once per process.
    for (_, server, client, _) in &sides {
        Connection::connect(server.addr, client)?.warm(0)?;
    }
    for _ in 0..rounds {
        for (_, server, client, times) in &mut sides {
            let started = Instant::now();
            let mut connection = Connection::connect(server.addr, client)?;
            connection.warm(0)?;
            times.push(started.elapsed());
            drop(connection);
        }
    }
    report(
        &format!("connect + authenticate + one answer, {rounds} connections each, 127.0.0.1:"),
        sides
            .into_iter()
            .map(|(security, _, _, times)| (security, times)),
        "per connection",
    );
    admin_cost(&runtime, &secret, rounds)
}

/// `GET /status` of the admin API on a new connection each time, plain and over TLS.
fn admin_cost(
    runtime: &tokio::runtime::Runtime,
    secret: &str,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use ebbflow_runtime::elastic_coordinator::{ElasticService, router};
    let mut sides = Vec::new();
    for security in [TransportSecurity::None, TransportSecurity::Tls] {
        let tls = JobTls::for_security(security, secret.as_bytes());
        let service = ElasticService::new(
            secret.to_owned(),
            "handshake-cost".into(),
            1,
            std::sync::Arc::default(),
            prometheus::Registry::new(),
            RuntimeMetrics::unregistered(),
            std::sync::Arc::new(ebbflow_runtime::heartbeat::Heartbeats::unregistered(
                Duration::from_secs(60),
            )),
        );
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let url = format!(
            "{}://{}/status",
            ebbflow_runtime::admin::scheme(tls.is_some()),
            listener.local_addr()?
        );
        let served = tls.clone();
        let refused = RuntimeMetrics::unregistered().admin_connections_refused;
        runtime.spawn(async move {
            ebbflow_runtime::admin::serve(
                listener,
                router(service),
                served.as_deref(),
                refused,
                std::future::pending(),
            )
            .await
        });
        // No idle connections kept: every call opens its own.
        let client = ebbflow_runtime::admin::client(tls.as_deref())
            .pool_max_idle_per_host(0)
            .build()?;
        sides.push((security, url, client, Vec::with_capacity(rounds)));
    }
    let call = |client: &reqwest::Client, url: &str| {
        runtime.block_on(async {
            client
                .get(url)
                .bearer_auth(secret)
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await
        })
    };
    for (_, url, client, _) in &sides {
        call(client, url)?;
    }
    for _ in 0..rounds {
        for (_, url, client, times) in &mut sides {
            let started = Instant::now();
            call(client, url)?;
            times.push(started.elapsed());
        }
    }
    report(
        &format!("admin API: connect + GET /status, {rounds} calls each, 127.0.0.1:"),
        sides
            .into_iter()
            .map(|(security, _, _, times)| (security, times)),
        "per admin call on a new connection",
    );
    Ok(())
}

/// Prints `title`, each side's median and 90th percentile, and what TLS (the second side) adds
/// to the first's median.
fn report(
    title: &str,
    sides: impl Iterator<Item = (TransportSecurity, Vec<Duration>)>,
    what: &str,
) {
    println!("{title}");
    let mut medians = Vec::new();
    for (security, mut times) in sides {
        times.sort();
        let median = times[times.len() / 2];
        let p90 = times[times.len() * 9 / 10];
        println!(
            "  {:<4}  median {:.3} ms  p90 {:.3} ms",
            security.to_string(),
            median.as_secs_f64() * 1e3,
            p90.as_secs_f64() * 1e3
        );
        medians.push(median);
    }
    println!(
        "TLS adds {:.3} ms {what} (median)",
        (medians[1].as_secs_f64() - medians[0].as_secs_f64()) * 1e3
    );
}
