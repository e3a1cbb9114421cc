//! Errors of the EC2 seam and their retry classification.
//!
//! Every SDK failure is mapped onto a small closed set of kinds, so callers decide what to do
//! (back off and retry, try another pool, fall back, give up) without string matching, and
//! metrics can label by [`ErrorCategory`]. Messages carry the operation, the EC2 error code and
//! EC2's own message; never request headers, signatures or credentials.

use std::fmt;

/// The EC2 API operations this crate calls; a closed set, usable as a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `DescribeSpotPriceHistory`.
    DescribeSpotPriceHistory,
    /// `DescribeInstanceTypes`.
    DescribeInstanceTypes,
    /// `DescribeInstanceTypeOfferings`.
    DescribeInstanceTypeOfferings,
    /// `GetSpotPlacementScores`.
    GetSpotPlacementScores,
    /// `RunInstances`.
    RunInstances,
    /// `CreateFleet`.
    CreateFleet,
    /// `DescribeInstances`.
    DescribeInstances,
    /// `TerminateInstances`.
    TerminateInstances,
    /// `DescribeSpotInstanceRequests`.
    DescribeSpotInstanceRequests,
}

impl Operation {
    /// The EC2 API name of the operation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DescribeSpotPriceHistory => "DescribeSpotPriceHistory",
            Self::DescribeInstanceTypes => "DescribeInstanceTypes",
            Self::DescribeInstanceTypeOfferings => "DescribeInstanceTypeOfferings",
            Self::GetSpotPlacementScores => "GetSpotPlacementScores",
            Self::RunInstances => "RunInstances",
            Self::CreateFleet => "CreateFleet",
            Self::DescribeInstances => "DescribeInstances",
            Self::TerminateInstances => "TerminateInstances",
            Self::DescribeSpotInstanceRequests => "DescribeSpotInstanceRequests",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A bounded classification of [`Ec2Error`], for metrics labels and event reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// EC2 throttled the request (`RequestLimitExceeded` and friends).
    Throttled,
    /// EC2 failed on its side (5xx, `InternalError`, `Unavailable`).
    Server,
    /// The request or a connection attempt timed out.
    Timeout,
    /// The endpoint could not be reached (DNS, refused, reset, TLS).
    Connection,
    /// Credentials missing, rejected or lacking permission.
    Auth,
    /// EC2 rejected the request as malformed or invalid.
    InvalidRequest,
    /// A referenced resource (instance, template, image) does not exist.
    NotFound,
    /// No capacity or quota for this pool right now (`InsufficientInstanceCapacity`, limits).
    Capacity,
    /// The endpoint does not offer this operation (moto, some regions, partitions).
    Unsupported,
    /// The request was invalid before it was sent.
    InvalidArgument,
    /// EC2 answered with something this crate cannot interpret.
    InvalidResponse,
    /// Anything else.
    Other,
}

impl ErrorCategory {
    /// A stable snake_case label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Throttled => "throttled",
            Self::Server => "server",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::Auth => "auth",
            Self::InvalidRequest => "invalid_request",
            Self::NotFound => "not_found",
            Self::Capacity => "capacity",
            Self::Unsupported => "unsupported",
            Self::InvalidArgument => "invalid_argument",
            Self::InvalidResponse => "invalid_response",
            Self::Other => "other",
        }
    }

    /// What a caller should do about an error of this category.
    pub fn retry(self) -> RetryAdvice {
        match self {
            Self::Throttled | Self::Server | Self::Timeout | Self::Connection => {
                RetryAdvice::Backoff
            }
            Self::Capacity => RetryAdvice::OtherPool,
            Self::Auth
            | Self::InvalidRequest
            | Self::NotFound
            | Self::Unsupported
            | Self::InvalidArgument
            | Self::InvalidResponse
            | Self::Other => RetryAdvice::Never,
        }
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to react to a failed call (after the SDK's own bounded retries are spent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryAdvice {
    /// Transient: the same request may succeed later; back off and retry.
    Backoff,
    /// This pool (instance type × zone × capacity type) has no capacity or quota now: try another
    /// pool, or this one again much later.
    OtherPool,
    /// Retrying the same request will fail the same way.
    Never,
}

/// A failure of the EC2 seam.
#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    /// EC2 answered with an error (or the transport failed); see [`Ec2Error::category`].
    #[error("ec2 {operation} failed ({category}, code {code}, http {status}): {message}", status = fmt_status(*.status))]
    Api {
        /// The operation that failed.
        operation: Operation,
        /// The classification of the failure.
        category: ErrorCategory,
        /// EC2's error code (`InvalidParameterValue`, …), or a transport label.
        code: String,
        /// The HTTP status, when a response arrived.
        status: Option<u16>,
        /// EC2's error message or the transport's description.
        message: String,
    },
    /// The request was rejected before sending.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending input.
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// EC2 answered, but the answer lacks a field or holds a value that cannot be parsed.
    #[error("ec2 {operation} returned an unusable response: {detail}")]
    InvalidResponse {
        /// The operation whose response was unusable.
        operation: Operation,
        /// What was wrong.
        detail: String,
    },
}

fn fmt_status(status: Option<u16>) -> String {
    status.map_or_else(|| "-".to_owned(), |s| s.to_string())
}

impl Ec2Error {
    /// The bounded classification of this error.
    pub fn category(&self) -> ErrorCategory {
        match self {
            Self::Api { category, .. } => *category,
            Self::InvalidArgument { .. } => ErrorCategory::InvalidArgument,
            Self::InvalidResponse { .. } => ErrorCategory::InvalidResponse,
        }
    }

    /// What a caller should do about this error.
    pub fn retry(&self) -> RetryAdvice {
        self.category().retry()
    }

    /// True when the same request may succeed after a backoff.
    pub fn is_retryable(&self) -> bool {
        self.retry() == RetryAdvice::Backoff
    }

    /// The EC2 error code, when EC2 sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The operation that failed, when a call was made.
    pub fn operation(&self) -> Option<Operation> {
        match self {
            Self::Api { operation, .. } | Self::InvalidResponse { operation, .. } => {
                Some(*operation)
            }
            Self::InvalidArgument { .. } => None,
        }
    }
}

/// Classifies an EC2 error code (and HTTP status, when known) into a category.
///
/// Codes come from the EC2 API reference ("Error codes for the Amazon EC2 API"); unknown
/// codes fall back on the status: 5xx is a server fault, anything else is not retried.
pub fn classify_code(code: &str, status: Option<u16>) -> ErrorCategory {
    const THROTTLED: &[&str] = &[
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "EC2ThrottledException",
        "SlowDown",
        "PriorRequestNotComplete",
        "BandwidthLimitExceeded",
    ];
    const SERVER: &[&str] = &[
        "InternalError",
        "InternalFailure",
        "ServerInternal",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "Unavailable",
    ];
    const TIMEOUT: &[&str] = &["RequestTimeout", "RequestTimeoutException"];
    const AUTH: &[&str] = &[
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "ExpiredToken",
        "RequestExpired",
        "OptInRequired",
        "Blocked",
        "PendingVerification",
        "AccessDenied",
        "AccessDeniedException",
    ];
    const UNSUPPORTED: &[&str] = &[
        "UnsupportedOperation",
        "InvalidAction",
        "UnknownOperationException",
        "NotImplemented",
    ];
    // "Unsupported" is what EC2 says when an instance type is not offered in the requested
    // zone: a property of the pool, like missing capacity.
    const CAPACITY: &[&str] = &[
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "Unsupported",
    ];
    const INVALID: &[&str] = &[
        "MissingParameter",
        "MissingAction",
        "UnknownParameter",
        "ValidationError",
        "MalformedQueryString",
        "IdempotentParameterMismatch",
        "IncorrectState",
        "IncorrectInstanceState",
        "OperationNotPermitted",
        "DryRunOperation",
        "InvalidQueryParameter",
        "InvalidParameter",
        "InvalidParameterValue",
        "InvalidParameterCombination",
    ];

    let listed = |list: &[&str]| list.contains(&code);
    if listed(THROTTLED) {
        ErrorCategory::Throttled
    } else if listed(SERVER) {
        ErrorCategory::Server
    } else if listed(TIMEOUT) {
        ErrorCategory::Timeout
    } else if listed(AUTH) {
        ErrorCategory::Auth
    } else if listed(UNSUPPORTED) {
        ErrorCategory::Unsupported
    } else if listed(CAPACITY) {
        ErrorCategory::Capacity
    } else if code.ends_with(".NotFound") || code.ends_with("NotFound") {
        ErrorCategory::NotFound
    } else if listed(INVALID) || code.starts_with("Invalid") || code.ends_with(".Malformed") {
        ErrorCategory::InvalidRequest
    } else {
        match status {
            Some(429) => ErrorCategory::Throttled,
            Some(500..=599) => ErrorCategory::Server,
            Some(401 | 403) => ErrorCategory::Auth,
            _ => ErrorCategory::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_server_and_timeouts_are_retryable() {
        for code in ["RequestLimitExceeded", "Throttling", "ThrottlingException"] {
            assert_eq!(
                classify_code(code, Some(503)),
                ErrorCategory::Throttled,
                "{code}"
            );
        }
        assert_eq!(
            classify_code("InternalError", Some(500)),
            ErrorCategory::Server
        );
        assert_eq!(
            classify_code("Unavailable", Some(503)),
            ErrorCategory::Server
        );
        assert_eq!(
            classify_code("RequestTimeout", None),
            ErrorCategory::Timeout
        );
        assert_eq!(
            classify_code("SomethingNew", Some(502)),
            ErrorCategory::Server
        );
        assert_eq!(
            classify_code("SomethingNew", Some(429)),
            ErrorCategory::Throttled
        );
        for category in [
            ErrorCategory::Throttled,
            ErrorCategory::Server,
            ErrorCategory::Timeout,
            ErrorCategory::Connection,
        ] {
            assert_eq!(category.retry(), RetryAdvice::Backoff, "{category}");
        }
    }

    #[test]
    fn auth_and_validation_are_not_retryable() {
        for code in [
            "AuthFailure",
            "UnauthorizedOperation",
            "ExpiredToken",
            "OptInRequired",
        ] {
            let category = classify_code(code, Some(403));
            assert_eq!(category, ErrorCategory::Auth, "{code}");
            assert_eq!(category.retry(), RetryAdvice::Never);
        }
        for code in [
            "InvalidParameterValue",
            "MissingParameter",
            "InvalidAMIID.Malformed",
            "InvalidNextToken",
            "ValidationError",
        ] {
            let category = classify_code(code, Some(400));
            assert_eq!(category, ErrorCategory::InvalidRequest, "{code}");
            assert_eq!(category.retry(), RetryAdvice::Never);
        }
        assert_eq!(
            classify_code("SomethingNew", Some(400)),
            ErrorCategory::Other
        );
        assert_eq!(ErrorCategory::Other.retry(), RetryAdvice::Never);
    }

    #[test]
    fn not_found_capacity_and_unsupported() {
        assert_eq!(
            classify_code("InvalidInstanceID.NotFound", Some(400)),
            ErrorCategory::NotFound
        );
        assert_eq!(
            classify_code("InvalidInstanceType.NotFound", Some(400)),
            ErrorCategory::NotFound
        );
        for code in [
            "InsufficientInstanceCapacity",
            "SpotMaxPriceTooLow",
            "MaxSpotInstanceCountExceeded",
            "VcpuLimitExceeded",
            "Unsupported",
        ] {
            let category = classify_code(code, Some(400));
            assert_eq!(category, ErrorCategory::Capacity, "{code}");
            assert_eq!(category.retry(), RetryAdvice::OtherPool);
        }
        assert_eq!(
            classify_code("UnsupportedOperation", Some(400)),
            ErrorCategory::Unsupported
        );
        assert_eq!(ErrorCategory::Unsupported.retry(), RetryAdvice::Never);
    }

    #[test]
    fn error_accessors_and_display() {
        let error = Ec2Error::Api {
            operation: Operation::RunInstances,
            category: ErrorCategory::Throttled,
            code: "RequestLimitExceeded".into(),
            status: Some(503),
            message: "Request limit exceeded.".into(),
        };
        assert!(error.is_retryable());
        assert_eq!(error.code(), Some("RequestLimitExceeded"));
        assert_eq!(error.operation(), Some(Operation::RunInstances));
        assert_eq!(
            error.to_string(),
            "ec2 RunInstances failed (throttled, code RequestLimitExceeded, http 503): \
             Request limit exceeded."
        );
        let invalid = Ec2Error::InvalidArgument {
            field: "max_price_usd_hr",
            reason: "must be positive".into(),
        };
        assert_eq!(invalid.category(), ErrorCategory::InvalidArgument);
        assert!(!invalid.is_retryable());
        assert_eq!(invalid.operation(), None);
    }
}
