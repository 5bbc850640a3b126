// SPDX-License-Identifier: Apache-2.0
//! The agent's configuration, compatible with kube-proxy's: the `KubeProxyConfiguration`
//! file (kubeproxy.config.k8s.io/v1alpha1), kube-proxy's flags, upstream's defaults,
//! validation and precedence rules, plus an `ebpf` section and flags of our own.
//!
//! The binary calls [`resolve`] with its parsed [`Flags`] and the `ArgMatches` they came from:
//!
//! ```no_run
//! use clap::{CommandFactory, FromArgMatches, Parser};
//! use proxy_agent::config::{self, Flags};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     flags: Flags,
//! }
//!
//! let matches = Cli::command().get_matches();
//! let cli = Cli::from_arg_matches(&matches).expect("clap validated the arguments");
//! match config::resolve(&cli.flags, &matches) {
//!     Ok(resolved) => {
//!         for flag in &resolved.ignored_flags {
//!             tracing::warn!(flag = %flag, "flag ignored because --config is given");
//!         }
//!         for warning in &resolved.warnings {
//!             tracing::warn!("{warning}");
//!         }
//!     }
//!     Err(error) => {
//!         eprintln!("{error}");
//!         std::process::exit(1);
//!     }
//! }
//! ```
//!
//! Where this differs from kube-proxy (each is explained where it is implemented):
//! - an empty `mode` means `ebpf` (ours), not `iptables`;
//! - `featureGates` accepts any name; `ipvs.scheduler` is checked against the kernel's list;
//! - the older struct's `udpIdleTimeout` is still accepted, defaulted and validated.

mod defaults;
mod duration;
mod field;
mod flags;
mod load;
mod net;
mod typed;
mod types;
mod validate;

use std::path::PathBuf;

use clap::ArgMatches;
use ipnet::IpNet;

pub use defaults::{
    DEFAULT_BPFFS_ROOT, DEFAULT_CONTENT_TYPE, PROXY_HEALTHZ_PORT, PROXY_STATUS_PORT,
    apply_defaults, apply_platform_defaults, apply_v1alpha1_defaults, default_config,
};
pub use duration::{Duration, DurationParseError};
pub use field::{BadValue, ErrorType, FieldError};
pub use flags::{
    FeatureGates, Flags, VModule, VersionRequest, flag_dump, normalize_word_separators,
    parse_version_request,
};
pub use load::{
    load_file, load_file_with_warnings, load_files_with_warnings, parse_lenient, parse_str,
    to_yaml, write_config,
};
pub use net::PortRange;
pub use typed::{LocalMode, NodePortAddress, NodePortAddresses, ProxyMode, SyncPeriods, XdpMode};
pub use types::{
    API_VERSION, ClientConnectionConfiguration, ConntrackConfiguration, DetectLocalConfiguration,
    EbpfConfiguration, EbpfConntrack, IptablesConfiguration, IpvsConfiguration, KIND,
    KubeProxyConfiguration, LoggingConfiguration, MapSizeLimits, MapSizes, NftablesConfiguration,
    VModuleItem, WinkernelConfiguration,
};
pub use validate::{IPVS_SCHEDULERS, MAX_MAP_ENTRIES, validate};

use flags::{FlagClass, flag_class};

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// Why no configuration could be produced. `Display` gives one line per problem, ready to
/// print before exiting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read configuration file: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },

    /// The file is not valid YAML/JSON, or a field is unknown or of the wrong type.
    /// `field` is the dotted path ("iptables.masqueradeBit"), empty for the document itself.
    #[error("{}", decode_line(path, field, message))]
    Decode {
        path: PathBuf,
        field: String,
        message: String,
    },

    /// Field-level problems, sorted by path; `origin` is the file or "command line".
    #[error("{}", invalid_lines(origin, errors))]
    Invalid {
        origin: String,
        errors: Vec<FieldError>,
    },

    /// A flag value refused outside clap's parsing (e.g. a blank --hostname-override).
    #[error("{0}")]
    Flag(String),

    #[error("{}: cannot write configuration: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("cannot serialize configuration: {0}")]
    Serialize(String),
}

fn decode_line(path: &std::path::Path, field: &str, message: &str) -> String {
    if field.is_empty() {
        format!("{}: {message}", path.display())
    } else {
        format!("{}: {field}: {message}", path.display())
    }
}

fn invalid_lines(origin: &str, errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|error| format!("{origin}: {error}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Settings that steer the process but are not part of the configuration file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOptions {
    pub config_file: Option<PathBuf>,
    /// `--config-overrides`: laid over `config_file`.
    pub config_overrides_file: Option<PathBuf>,
    pub write_config_to: Option<PathBuf>,
    pub cleanup: bool,
    pub init_only: bool,
    /// API server URL overriding the kubeconfig's.
    pub master: Option<String>,
    /// No fallback to another mode when the selected one cannot run.
    pub strict_mode: bool,
    /// Read manifests from this directory instead of an API server.
    pub source_dir: Option<PathBuf>,
    /// `logging.verbosity` after the -v flag.
    pub verbosity: u32,
    /// `logging.format` after --logging-format ("text" or "json").
    pub log_format: String,
}

/// Typed values of a validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Effective {
    pub mode: ProxyMode,
    pub local_mode: LocalMode,
    /// Empty when unset (or unusable outside ClusterCIDR mode, which earns a warning).
    pub cluster_cidrs: Vec<IpNet>,
    pub node_port_addresses: NodePortAddresses,
    pub sync_periods: SyncPeriods,
    pub masquerade_all: bool,
    pub xdp_mode: XdpMode,
}

/// The outcome of [`resolve`].
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Defaulted and validated.
    pub config: KubeProxyConfiguration,
    pub effective: Effective,
    /// Flags given on the command line that --config overrides, as "--name".
    pub ignored_flags: Vec<String>,
    /// Things worth logging: deprecated or ineffective flags, ignored settings.
    pub warnings: Vec<String>,
    pub options: RunOptions,
}

/// Builds the configuration the way kube-proxy does:
/// - with `--config`, the file (defaulted) replaces every configuration flag, except the
///   logging flags and `--hostname-override`, which still apply; the overridden flags that
///   were given are returned in `ignored_flags`; `--config-overrides` lays its fields over
///   the file's before defaulting ([`load_files_with_warnings`]);
/// - without it, the flags are applied to the defaulted empty configuration, and the
///   deprecated `--healthz-port`/`--metrics-port` are merged into the bind addresses
///   (unless `--write-config-to` is given, as upstream);
/// - then the platform defaults (mode, detect-local mode) are filled and everything is
///   validated; all problems are reported together.
///
/// `matches` must be the `ArgMatches` that `flags` was built from (it tells flags given on
/// the command line from defaults).
pub fn resolve(flags: &Flags, matches: &ArgMatches) -> Result<Resolved> {
    let set_flags = flags::explicitly_set(matches);
    let mut warnings = flags::deprecation_warnings(&set_flags);
    let mut ignored_flags = Vec::new();

    let (mut config, origin) = match &flags.config {
        Some(path) => {
            ignored_flags = set_flags
                .iter()
                .filter(|flag| flag_class(flag) == FlagClass::Config)
                .map(|flag| format!("--{flag}"))
                .collect();
            let (config, unknown_fields, origin) = match &flags.config_overrides {
                Some(overrides) => {
                    let (config, unknown_fields) = load_files_with_warnings(path, overrides)?;
                    let origin = format!("{} with {}", path.display(), overrides.display());
                    (config, unknown_fields, origin)
                }
                None => {
                    let (config, unknown_fields) = load_file_with_warnings(path)?;
                    (config, unknown_fields, path.display().to_string())
                }
            };
            warnings.extend(unknown_fields);
            (config, origin)
        }
        None => {
            let mut config = KubeProxyConfiguration {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
                ..Default::default()
            };
            apply_v1alpha1_defaults(&mut config);
            warnings.extend(flags::apply_config_flags(flags, &mut config));
            if flags.write_config_to.is_none() {
                flags::apply_deprecated_port_flags(flags, &mut config);
            }
            (config, "command line".to_owned())
        }
    };
    flags::apply_logging_flags(flags, &mut config.logging);
    apply_platform_defaults(&mut config);
    flags::apply_hostname_override(flags, &mut config)?;

    let errors = validate(&config);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid { origin, errors });
    }
    let effective = effective(&config).map_err(|error| ConfigError::Invalid {
        origin,
        errors: vec![error],
    })?;
    warnings.extend(config_warnings(&config, &effective));

    let options = RunOptions {
        config_file: flags.config.clone(),
        config_overrides_file: flags.config_overrides.clone(),
        write_config_to: flags.write_config_to.clone(),
        cleanup: flags.cleanup,
        init_only: flags.init_only,
        master: flags.master.clone().filter(|master| !master.is_empty()),
        strict_mode: flags.strict_mode,
        source_dir: flags.source_dir.clone(),
        verbosity: config.logging.verbosity,
        log_format: config.logging.format.clone(),
    };
    Ok(Resolved {
        config,
        effective,
        ignored_flags,
        warnings,
        options,
    })
}

/// The typed view; on a validated configuration only an internal inconsistency between
/// validation and parsing could make it fail.
pub fn effective(config: &KubeProxyConfiguration) -> Result<Effective, FieldError> {
    let mode = config.proxy_mode()?;
    let local_mode = config.local_mode()?;
    let cluster_cidrs = match local_mode {
        LocalMode::ClusterCidr => config.cluster_cidrs()?,
        _ => config.cluster_cidrs().unwrap_or_default(),
    };
    Ok(Effective {
        mode,
        local_mode,
        cluster_cidrs,
        node_port_addresses: config.node_port_addresses()?,
        sync_periods: config.effective_sync_periods(mode),
        masquerade_all: config.masquerade_all(mode),
        xdp_mode: config.xdp_mode()?,
    })
}

/// Settings that are accepted but have no effect, and setups upstream flags as probably
/// wrong at startup.
fn config_warnings(config: &KubeProxyConfiguration, effective: &Effective) -> Vec<String> {
    let mut warnings = Vec::new();
    if config.winkernel != WinkernelConfiguration::default() || config.windows_run_as_service {
        warnings.push(
            "winkernel and windowsRunAsService are Windows-only settings and are ignored"
                .to_owned(),
        );
    }
    if !config.port_range.is_empty() {
        warnings.push("portRange configured the removed userspace proxy and is ignored".to_owned());
    }
    if config.udp_idle_timeout != Duration::from_millis(250) {
        warnings.push(
            "udpIdleTimeout configured the removed userspace proxy and is ignored".to_owned(),
        );
    }
    if !config.feature_gates.is_empty() {
        let names: Vec<&str> = config.feature_gates.keys().map(String::as_str).collect();
        warnings.push(format!(
            "featureGates are accepted for compatibility but not interpreted by this agent: {}",
            names.join(", ")
        ));
    }
    match effective.local_mode {
        LocalMode::ClusterCidr if config.cluster_cidr.is_empty() => warnings.push(
            "detectLocalMode is ClusterCIDR but clusterCIDR is unset: no traffic will be treated as local".to_owned(),
        ),
        LocalMode::ClusterCidr => {}
        _ if !config.cluster_cidr.is_empty() && config.cluster_cidrs().is_err() => warnings.push(format!(
            "clusterCIDR {:?} is not valid; it is ignored because detectLocalMode is {}",
            config.cluster_cidr,
            effective.local_mode.as_str()
        )),
        _ => {}
    }
    if config.node_port_addresses.is_empty() {
        warnings.push(
            "nodePortAddresses is unset: NodePort connections will be accepted on all local IPs; \
             consider --nodeport-addresses primary"
                .to_owned(),
        );
    }
    warnings
}

#[cfg(test)]
mod field_coverage_tests;
#[cfg(test)]
mod tests;
