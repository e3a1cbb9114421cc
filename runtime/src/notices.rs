//! Eviction notices raised inside a node process: the EC2 instance metadata service (a spot
//! `instance-action` or a rebalance recommendation) and SIGTERM (the pod's grace period). Each
//! becomes "this node leaves at T", posted to the coordinator's `/notice`; duplicates are
//! harmless there.
//!
//! The metadata endpoint is configurable (`http://169.254.169.254` on EC2; off elsewhere) and is
//! read with an IMDSv2 session token, falling back to IMDSv1 when the token call fails.

use std::time::Duration;

use ebbflow_runtime_api::{NoticeRequest, NoticeResponse};
use thiserror::Error;

/// Seconds a rebalance recommendation is treated as leaving in (it is not an interruption; the
/// operator reads it the same way).
pub const REBALANCE_LEAD_SECONDS: u64 = 600;

/// What the metadata service says about this instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceNotice {
    /// A spot interruption: `action` (terminate, stop, hibernate) at `at_unix`.
    Interruption {
        /// The action.
        action: String,
        /// When, in Unix seconds.
        at_unix: u64,
    },
    /// A rebalance recommendation noticed at `noticed_unix`.
    Rebalance {
        /// When it was issued, in Unix seconds.
        noticed_unix: u64,
    },
}

impl InstanceNotice {
    /// When the instance should be assumed gone.
    pub fn deadline_unix(&self) -> u64 {
        match self {
            InstanceNotice::Interruption { at_unix, .. } => *at_unix,
            InstanceNotice::Rebalance { noticed_unix } => noticed_unix + REBALANCE_LEAD_SECONDS,
        }
    }
}

/// Errors reading the metadata service or telling the coordinator.
#[derive(Debug, Error)]
pub enum NoticeError {
    /// The request failed.
    #[error("request {url}: {source}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The service answered with an unexpected status.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// The body (truncated).
        body: String,
    },
    /// The body is not what the metadata service documents.
    #[error("{url}: cannot read {body:?}: {reason}")]
    Parse {
        /// The URL.
        url: String,
        /// The body (truncated).
        body: String,
        /// What is wrong.
        reason: String,
    },
}

impl NoticeError {
    /// Static label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            NoticeError::Request { .. } => "request",
            NoticeError::Status { .. } => "status",
            NoticeError::Parse { .. } => "parse",
        }
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Unix seconds of an RFC 3339 UTC time as the metadata service writes it
/// (`2020-01-07T01:03:47Z`, optionally with fractional seconds).
pub fn parse_utc(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let body = text
        .strip_suffix('Z')
        .ok_or_else(|| format!("{text:?} is not a UTC time ending in Z"))?;
    let (date, time) = body
        .split_once('T')
        .ok_or_else(|| format!("{text:?} has no T between date and time"))?;
    let numbers = |part: &str, what: &str| -> Result<Vec<i64>, String> {
        part.split(['-', ':'])
            .map(|n| {
                n.parse::<i64>()
                    .map_err(|_| format!("{text:?}: bad {what}"))
            })
            .collect()
    };
    let date = numbers(date, "date")?;
    let time = numbers(time.split('.').next().unwrap_or(time), "time")?;
    let [year, month, day] =
        <[i64; 3]>::try_from(date).map_err(|_| format!("{text:?}: date is not Y-M-D"))?;
    let [hour, minute, second] =
        <[i64; 3]>::try_from(time).map_err(|_| format!("{text:?}: time is not H:M:S"))?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&hour)
        || !(0..60).contains(&minute)
        || !(0..=60).contains(&second)
    {
        return Err(format!("{text:?}: a field is out of range"));
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds).map_err(|_| format!("{text:?} is before 1970"))
}

/// Reads the instance metadata service at `endpoint` (e.g. `http://169.254.169.254`).
#[derive(Debug, Clone)]
pub struct MetadataClient {
    http: reqwest::Client,
    endpoint: String,
}

impl MetadataClient {
    /// A client for `endpoint` with short timeouts (the service is link-local).
    pub fn new(endpoint: &str) -> Result<Self, NoticeError> {
        let http = crate::admin::client(None)
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|source| NoticeError::Request {
                url: endpoint.to_owned(),
                source,
            })?;
        Ok(Self {
            http,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
        })
    }

    /// An IMDSv2 session token, or `None` when the service does not issue one (IMDSv1).
    async fn token(&self) -> Option<String> {
        let response = self
            .http
            .put(format!("{}/latest/api/token", self.endpoint))
            .header("X-aws-ec2-metadata-token-ttl-seconds", "300")
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    }

    /// GETs `path`: `Ok(None)` on 404 (nothing to report).
    async fn get(&self, path: &str, token: Option<&str>) -> Result<Option<String>, NoticeError> {
        let url = format!("{}{path}", self.endpoint);
        let mut request = self.http.get(&url);
        if let Some(token) = token {
            request = request.header("X-aws-ec2-metadata-token", token);
        }
        let (status, body) = exchange(&url, request).await?;
        match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            _ => Err(NoticeError::Status {
                url,
                status,
                body: truncate(&body),
            }),
        }
    }

    /// The current notices: a spot interruption first, then a rebalance recommendation.
    pub async fn poll(&self) -> Result<Vec<InstanceNotice>, NoticeError> {
        let token = self.token().await;
        let mut notices = Vec::new();
        let action_path = "/latest/meta-data/spot/instance-action";
        if let Some(body) = self.get(action_path, token.as_deref()).await? {
            notices.push(parse_instance_action(&self.url(action_path), &body)?);
        }
        let rebalance_path = "/latest/meta-data/events/recommendations/rebalance";
        if let Some(body) = self.get(rebalance_path, token.as_deref()).await? {
            notices.push(parse_rebalance(&self.url(rebalance_path), &body)?);
        }
        Ok(notices)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }
}

/// Sends `request` to `url`; returns the status and body.
async fn exchange(
    url: &str,
    request: reqwest::RequestBuilder,
) -> Result<(u16, String), NoticeError> {
    let response = request
        .send()
        .await
        .map_err(|source| NoticeError::Request {
            url: url.to_owned(),
            source,
        })?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

fn parse_error(url: &str, body: &str, reason: String) -> NoticeError {
    NoticeError::Parse {
        url: url.to_owned(),
        body: truncate(body),
        reason,
    }
}

/// `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`.
pub fn parse_instance_action(url: &str, body: &str) -> Result<InstanceNotice, NoticeError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| parse_error(url, body, e.to_string()))?;
    let action = value["action"]
        .as_str()
        .ok_or_else(|| parse_error(url, body, "no \"action\" string".into()))?;
    let time = value["time"]
        .as_str()
        .ok_or_else(|| parse_error(url, body, "no \"time\" string".into()))?;
    Ok(InstanceNotice::Interruption {
        action: action.to_owned(),
        at_unix: parse_utc(time).map_err(|reason| parse_error(url, body, reason))?,
    })
}

/// `{"noticeTime": "2020-11-05T03:59:00Z"}`.
pub fn parse_rebalance(url: &str, body: &str) -> Result<InstanceNotice, NoticeError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| parse_error(url, body, e.to_string()))?;
    let time = value["noticeTime"]
        .as_str()
        .ok_or_else(|| parse_error(url, body, "no \"noticeTime\" string".into()))?;
    Ok(InstanceNotice::Rebalance {
        noticed_unix: parse_utc(time).map_err(|reason| parse_error(url, body, reason))?,
    })
}

/// Posts "node `name` leaves at `deadline_unix`" to the coordinator at `base`, authenticated
/// with the job `secret`.
pub async fn send_notice(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    name: &str,
    deadline_unix: u64,
) -> Result<NoticeResponse, NoticeError> {
    let deadline = std::time::UNIX_EPOCH + std::time::Duration::from_secs(deadline_unix);
    send_notice_at(http, base, secret, name, deadline).await
}

/// As [`send_notice`] with the deadline to the millisecond (short notice windows).
pub async fn send_notice_at(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    name: &str,
    deadline: std::time::SystemTime,
) -> Result<NoticeResponse, NoticeError> {
    let since_epoch = deadline
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let url = format!("{}/notice", base.trim_end_matches('/'));
    let request = http
        .post(&url)
        .header(
            reqwest::header::AUTHORIZATION,
            ebbflow_runtime_api::bearer(secret),
        )
        .json(&NoticeRequest {
            name: name.to_owned(),
            deadline_unix: since_epoch.as_secs(),
            deadline_unix_ms: Some(since_epoch.as_millis() as u64),
        });
    let (status, body) = exchange(&url, request).await?;
    if status != 200 {
        return Err(NoticeError::Status {
            url,
            status,
            body: truncate(&body),
        });
    }
    serde_json::from_str(&body).map_err(|e| parse_error(&url, &body, e.to_string()))
}

/// Polls the metadata service every `interval` and posts each new notice for node `name` to the
/// coordinator (an interruption once, a rebalance recommendation once). Runs until the
/// interruption was delivered; errors are logged and retried.
pub async fn watch_metadata(
    metadata: MetadataClient,
    http: reqwest::Client,
    coordinator: String,
    secret: String,
    name: String,
    interval: Duration,
) {
    let mut rebalance_sent = false;
    loop {
        match metadata.poll().await {
            Ok(notices) => {
                for notice in notices {
                    let interruption = matches!(notice, InstanceNotice::Interruption { .. });
                    if !interruption && rebalance_sent {
                        continue;
                    }
                    let deadline = notice.deadline_unix();
                    match send_notice(&http, &coordinator, &secret, &name, deadline).await {
                        Ok(_) => {
                            tracing::info!(?notice, "instance notice sent to the coordinator");
                            if interruption {
                                return;
                            }
                            rebalance_sent = true;
                        }
                        Err(error) => {
                            tracing::warn!(reason = error.category(), %error, "notice not delivered")
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(reason = error.category(), %error, "metadata service read failed")
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_parse_and_bad_ones_say_why() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_utc("2020-01-07T01:03:47Z"), Ok(1_578_359_027));
        assert_eq!(parse_utc("2024-02-29T12:00:00.123Z"), Ok(1_709_208_000));
        for bad in [
            "2020-01-07 01:03:47Z",
            "2020-01-07T01:03:47",
            "2020-13-07T01:03:47Z",
            "2020-01-07T25:03:47Z",
            "soon",
        ] {
            assert!(parse_utc(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn metadata_bodies_parse_and_bad_ones_name_the_url() {
        let url = "http://imds/latest/meta-data/spot/instance-action";
        assert_eq!(
            parse_instance_action(
                url,
                r#"{"action":"terminate","time":"2020-01-07T01:03:47Z"}"#
            )
            .unwrap(),
            InstanceNotice::Interruption {
                action: "terminate".into(),
                at_unix: 1_578_359_027
            }
        );
        let error = parse_instance_action(url, r#"{"action":"terminate"}"#).unwrap_err();
        assert!(error.to_string().contains(url) && error.to_string().contains("time"));
        let rebalance = parse_rebalance(url, r#"{"noticeTime":"2020-01-07T01:03:47Z"}"#).unwrap();
        assert_eq!(
            rebalance.deadline_unix(),
            1_578_359_027 + REBALANCE_LEAD_SECONDS
        );
        assert_eq!(
            parse_rebalance(url, "<html>").unwrap_err().category(),
            "parse"
        );
    }
}
