//! OpenTelemetry for decree: builds an OTLP/HTTP (protobuf) trace exporter and its tracer
//! provider, from `[tracing]` in decree.toml for the state server ([`Exporter::start`]) or
//! from the standard `OTEL_*` variables in a client process ([`install_from_env`]).
//!
//! What it is not: the spans themselves. The coordinator's are in `decree_core::trace`
//! (through OpenTelemetry's global provider, which [`install_from_env`] sets), the state
//! server's in decree-server (through its own provider, so that several servers in one
//! process keep their own node, member and epoch as resource attributes).
//!
//! Nothing here runs on a commit path: spans are queued by the SDK's batch processor (a
//! bounded queue, `export_queue_max`; spans past it are dropped and counted by the SDK)
//! and exported from its own thread over [`http::BlockingHttp`] (`http://`, or TLS for an
//! `https://` collector).

pub mod http;

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SamplingDecision, SamplingResult, SdkTracer,
    SdkTracerProvider, ShouldSample,
};
use opentelemetry_sdk::Resource;
use std::path::PathBuf;
use std::time::Duration;

/// Why tracing could not be set up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OtelError {
    /// A `[tracing]` value or an `OTEL_*` variable was refused; says which and why.
    #[error("tracing: {0}")]
    Config(String),
}

/// The largest bound on the server's map from Xid to span context.
pub const XID_CONTEXTS_MAX_CAP: u32 = 1 << 20;

/// `[tracing]` in decree.toml: where the state server sends its spans, and how many.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (`http://127.0.0.1:4318`, or `https://` for TLS); spans go to its `/v1/traces`.
    pub endpoint: String,
    /// The CA certificates (PEM) an `https://` collector's certificate must chain to, as
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`; absent: the system's CA bundle.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain (PEM) presented to an `https://` collector that asks
    /// for one (mutual TLS), as `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`; with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The private key (PEM) of `cert_file`, as `OTEL_EXPORTER_OTLP_CLIENT_KEY`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Share of the traces the server starts itself (recovery passes) that are sampled,
    /// 0.0 to 1.0; a client's sampled flag decides for its own transactions.
    #[serde(default = "default_sampling")]
    pub sampling: f64,
    /// The `service.name` resource attribute.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// How long finished spans wait to be exported in one batch.
    #[serde(default = "default_export_delay_ms")]
    pub export_delay_ms: u64,
    /// Finished spans waiting for export at most; more are dropped, never blocking.
    #[serde(default = "default_export_queue_max")]
    pub export_queue_max: u32,
    /// Transactions whose client's span context, from a request, the server keeps, so that
    /// recovery's later work links to them (oldest forgotten first). The contexts the log's
    /// records kept are not counted: each is held until recovery finishes its decision.
    #[serde(default = "default_xid_contexts_max")]
    pub xid_contexts_max: u32,
}

// `sampling` is never NaN once validated, so equality is reflexive (the server's
// configuration compares whole configurations).
impl Eq for TracingConfig {}

fn default_sampling() -> f64 {
    1.0
}
fn default_service_name() -> String {
    "decree-server".into()
}
fn default_export_delay_ms() -> u64 {
    1000
}
fn default_export_queue_max() -> u32 {
    8192
}
fn default_xid_contexts_max() -> u32 {
    65_536
}

impl TracingConfig {
    /// A configuration sending to `endpoint` with every default.
    pub fn to(endpoint: &str) -> TracingConfig {
        TracingConfig {
            endpoint: endpoint.into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            sampling: default_sampling(),
            service_name: default_service_name(),
            export_delay_ms: default_export_delay_ms(),
            export_queue_max: default_export_queue_max(),
            xid_contexts_max: default_xid_contexts_max(),
        }
    }

    /// Refuses values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), OtelError> {
        let bad = |why: String| Err(OtelError::Config(why));
        let Some(rest) =
            self.endpoint.strip_prefix("http://").or_else(|| self.endpoint.strip_prefix("https://"))
        else {
            return bad(format!(
                "tracing.endpoint = {:?} must be an http:// or https:// URL of an OTLP/HTTP collector, \
                 such as \"http://127.0.0.1:4318\"",
                self.endpoint
            ));
        };
        if rest.is_empty() || rest.starts_with('/') || self.endpoint.parse::<::http::Uri>().is_err() {
            return bad(format!("tracing.endpoint = {:?} names no host", self.endpoint));
        }
        let identity = self.client_identity().map_err(OtelError::Config)?;
        if identity.is_some() && !self.endpoint.starts_with("https://") {
            return bad(format!(
                "tracing.cert_file and tracing.key_file are presented over TLS only: tracing.endpoint = {:?} \
                 must be an https:// URL",
                self.endpoint
            ));
        }
        if !(0.0..=1.0).contains(&self.sampling) {
            return bad(format!("tracing.sampling = {} must be between 0.0 and 1.0", self.sampling));
        }
        if self.export_delay_ms == 0 || self.export_delay_ms > 60_000 {
            return bad(format!(
                "tracing.export_delay_ms = {} must be between 1 and 60000",
                self.export_delay_ms
            ));
        }
        if self.export_queue_max == 0 || self.export_queue_max > 1 << 20 {
            return bad(format!(
                "tracing.export_queue_max = {} must be between 1 and 1048576",
                self.export_queue_max
            ));
        }
        if self.xid_contexts_max == 0 || self.xid_contexts_max > XID_CONTEXTS_MAX_CAP {
            return bad(format!(
                "tracing.xid_contexts_max = {} must be between 1 and {XID_CONTEXTS_MAX_CAP}",
                self.xid_contexts_max
            ));
        }
        Ok(())
    }

    /// The client certificate and key to present (mutual TLS), when both are configured;
    /// one without the other is refused.
    pub fn client_identity(&self) -> Result<Option<http::ClientIdentity>, String> {
        http::ClientIdentity::from_pair(
            self.cert_file.as_deref(),
            self.key_file.as_deref(),
            ["tracing.cert_file", "tracing.key_file"],
        )
    }

    /// The traces URL: the endpoint with `/v1/traces` unless it names a path already.
    pub fn traces_url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        let rest = base.strip_prefix("http://").or_else(|| base.strip_prefix("https://"));
        match rest.and_then(|r| r.find('/')) {
            Some(_) => base.to_string(),
            None => format!("{base}/v1/traces"),
        }
    }
}

/// A running exporter and its provider; dropping it exports what is queued and stops.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

/// The exporter's timeout for one request.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

impl Exporter {
    /// The state server's exporter: spans to `config.endpoint`, with `attributes` (node,
    /// member, epoch) on the resource; sampled by [`ServerSampler`]: a parent's sampled
    /// flag decides for its children, the links for a new trace that has some,
    /// `config.sampling` for the other new traces.
    pub fn start(config: &TracingConfig, attributes: Vec<KeyValue>) -> Result<Exporter, OtelError> {
        config.validate()?;
        let identity = config.client_identity().map_err(OtelError::Config)?;
        let client = http::BlockingHttp::for_endpoint(
            &config.endpoint,
            config.ca_file.as_deref(),
            identity.as_ref(),
            EXPORT_TIMEOUT,
        )
        .map_err(|e| OtelError::Config(format!("tracing.endpoint = {:?}: {e}", config.endpoint)))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| OtelError::Config(format!("tracing.endpoint = {:?}: {e}", config.endpoint)))?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(Duration::from_millis(config.export_delay_ms))
            .with_max_queue_size(config.export_queue_max as usize)
            .build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
        let resource = Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attributes(attributes)
            .build();
        let sampler = ServerSampler::new(config.sampling);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .with_sampler(sampler)
            .build();
        Ok(Exporter { provider })
    }

    /// A tracer of this exporter's provider.
    pub fn tracer(&self, name: &'static str) -> SdkTracer {
        use opentelemetry::trace::TracerProvider;
        self.provider.tracer(name)
    }

    /// Exports every finished span now (tests, and before a planned stop).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// The state server's sampler. A span with a parent follows the parent's sampled flag; a
/// new trace that links to other spans (a group-commit write, linked to the decisions it
/// made durable) is kept exactly when one of them is sampled, since it is there to be
/// found from them (and the SDK's builder can no longer force a decision: opentelemetry
/// 0.33 took `with_sampling_result` away); any other new trace (a recovery pass) is kept
/// at the ratio `tracing.sampling`.
#[derive(Debug, Clone)]
pub struct ServerSampler {
    own: Sampler,
}

impl ServerSampler {
    /// Samples new traces without links at `ratio` (0.0 to 1.0).
    pub fn new(ratio: f64) -> ServerSampler {
        ServerSampler { own: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))) }
    }
}

impl ShouldSample for ServerSampler {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let has_parent = parent.is_some_and(|cx| cx.span().span_context().is_valid());
        if has_parent || links.is_empty() {
            return self.own.should_sample(parent, trace_id, name, kind, attributes, links);
        }
        let linked_sampled = links.iter().any(|link| link.span_context.is_sampled());
        SamplingResult {
            decision: if linked_sampled { SamplingDecision::RecordAndSample } else { SamplingDecision::Drop },
            attributes: Vec::new(),
            trace_state: TraceState::NONE,
        }
    }
}

/// Whether the standard variables ask for an OTLP trace exporter: an endpoint is set
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`), and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns it off.
pub fn configured_by_env() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// In a client process: when the standard variables configure an OTLP endpoint
/// ([`configured_by_env`]), installs an OTLP/HTTP exporter as OpenTelemetry's global
/// provider (`OTEL_SERVICE_NAME` or `service_name`; sampler from `OTEL_TRACES_SAMPLER`,
/// batching from `OTEL_BSP_*`; an `https://` endpoint's CA from
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`, else the system's) and turns the coordinator's spans on. `None` when nothing
/// is configured: spans stay off and cost nothing. Keep the exporter for the life of the
/// process: dropping it exports what is left.
pub fn install_from_env(service_name: &str) -> Result<Option<Exporter>, OtelError> {
    if !configured_by_env() {
        return Ok(None);
    }
    let variable =
        |names: [&str; 2]| names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()));
    let endpoint =
        variable(["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]).unwrap_or_default();
    let ca_file = variable(["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"]);
    let identity = client_identity_from_env(&variable)?;
    let client = http::BlockingHttp::for_endpoint(
        endpoint.trim(),
        ca_file.as_deref().map(std::path::Path::new),
        identity.as_ref(),
        EXPORT_TIMEOUT,
    )
    .map_err(|e| OtelError::Config(format!("OTEL_EXPORTER_OTLP_*: {e}")))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(|e| OtelError::Config(format!("OTEL_EXPORTER_OTLP_*: {e}")))?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service_name.to_string());
    let resource = Resource::builder().with_service_name(service).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    decree_core::trace::enable();
    Ok(Some(Exporter { provider }))
}

/// The client certificate and key of the standard variables (the `TRACES_` ones first),
/// for a collector that asks for one; one without the other is refused by name.
fn client_identity_from_env(
    variable: &dyn Fn([&str; 2]) -> Option<String>,
) -> Result<Option<http::ClientIdentity>, OtelError> {
    let cert =
        variable(["OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"]);
    let key = variable(["OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"]);
    http::ClientIdentity::from_pair(
        cert.as_deref().map(std::path::Path::new),
        key.as_deref().map(std::path::Path::new),
        ["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY"],
    )
    .map_err(|e| OtelError::Config(format!("OTEL_EXPORTER_OTLP_*: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tracing_values_are_refused_by_name() {
        assert!(TracingConfig::to("http://127.0.0.1:4318").validate().is_ok());
        assert!(TracingConfig::to("https://collector.example:4318").validate().is_ok());
        for (config, key) in [
            (TracingConfig::to("127.0.0.1:4318"), "tracing.endpoint"),
            (TracingConfig::to("ftp://collector:4318"), "http:// or https://"),
            (TracingConfig::to("http://"), "names no host"),
            (TracingConfig { sampling: 1.5, ..TracingConfig::to("http://a:1") }, "tracing.sampling"),
            (TracingConfig { xid_contexts_max: 0, ..TracingConfig::to("http://a:1") }, "xid_contexts_max"),
            (TracingConfig { export_delay_ms: 0, ..TracingConfig::to("http://a:1") }, "export_delay_ms"),
            (
                TracingConfig { cert_file: Some("c.pem".into()), ..TracingConfig::to("https://a:1") },
                "tracing.cert_file and tracing.key_file go together",
            ),
            (
                TracingConfig { key_file: Some("c.key".into()), ..TracingConfig::to("https://a:1") },
                "tracing.cert_file and tracing.key_file go together",
            ),
            (
                TracingConfig {
                    cert_file: Some("c.pem".into()),
                    key_file: Some("c.key".into()),
                    ..TracingConfig::to("http://a:1")
                },
                "must be an https:// URL",
            ),
        ] {
            let why = config.validate().unwrap_err().to_string();
            assert!(why.contains(key), "{why}");
        }
    }

    fn decide(trace: u8, flags: opentelemetry::trace::TraceFlags) -> opentelemetry::trace::SpanContext {
        use opentelemetry::trace::{SpanContext, SpanId};
        SpanContext::new(
            TraceId::from_bytes([trace; 16]),
            SpanId::from_bytes([1; 8]),
            flags,
            false,
            TraceState::NONE,
        )
    }

    fn sampled_by(sampler: &ServerSampler, parent: Option<&Context>, links: &[Link]) -> bool {
        let trace_id = TraceId::from_bytes([7; 16]);
        let result = sampler.should_sample(
            parent,
            trace_id,
            "decree.log.group_write",
            &SpanKind::Internal,
            &[],
            links,
        );
        result.decision == SamplingDecision::RecordAndSample
    }

    #[test]
    fn a_new_trace_with_links_is_kept_exactly_when_one_of_them_is_sampled() {
        use opentelemetry::trace::TraceFlags;
        let (sampled, unsampled) = (decide(1, TraceFlags::SAMPLED), decide(2, TraceFlags::default()));
        for ratio in [0.0, 0.5, 1.0] {
            let sampler = ServerSampler::new(ratio);
            let mixed = [Link::with_context(unsampled.clone()), Link::with_context(sampled.clone())];
            assert!(sampled_by(&sampler, None, &mixed), "ratio {ratio}: a sampled decision keeps its write");
            assert!(!sampled_by(&sampler, None, &[Link::with_context(unsampled.clone())]), "ratio {ratio}");
        }
        // Without links, or with a parent, it is the usual sampler.
        assert!(!sampled_by(&ServerSampler::new(0.0), None, &[]));
        assert!(sampled_by(&ServerSampler::new(1.0), None, &[]));
        let parent = Context::new().with_remote_span_context(unsampled.clone());
        assert!(!sampled_by(&ServerSampler::new(1.0), Some(&parent), &[Link::with_context(sampled)]));
    }

    #[test]
    fn the_traces_url_adds_the_signal_path_to_a_base_url_only() {
        assert_eq!(TracingConfig::to("http://a:4318").traces_url(), "http://a:4318/v1/traces");
        assert_eq!(TracingConfig::to("http://a:4318/").traces_url(), "http://a:4318/v1/traces");
        assert_eq!(TracingConfig::to("http://a:4318/custom").traces_url(), "http://a:4318/custom");
        assert_eq!(TracingConfig::to("https://a:4318").traces_url(), "https://a:4318/v1/traces");
        assert_eq!(TracingConfig::to("https://a/custom").traces_url(), "https://a/custom");
    }
}
