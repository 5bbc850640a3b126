// SPDX-License-Identifier: Apache-2.0
//! The control plane's certificates: a CA made for one run, the API server's serving
//! certificate, one client certificate per identity, and the key pair ServiceAccount
//! tokens are signed with. Nothing here is meant to outlive the run: the CA is valid for a
//! few days and its key stays in the run's directory.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("making a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = PkiError> = std::result::Result<T, E>;

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// Who a client certificate says it is: the user name (CN) and its groups (O).
#[derive(Clone, Debug)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    pub fn new(user: &str, groups: &[&str]) -> Self {
        Self {
            user: user.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }
}

/// The run's certificate authority.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// How long the run's certificates are valid: far longer than any run, short enough that a
/// leaked directory is soon worthless.
const VALID_DAYS: u64 = 7;

fn validity(params: &mut CertificateParams) {
    let now = std::time::SystemTime::now();
    // An hour back for clocks that differ a little between the writer and the reader.
    let from = now - std::time::Duration::from_secs(3600);
    let until = now + std::time::Duration::from_secs(VALID_DAYS * 86_400);
    params.not_before = from.into();
    params.not_after = until.into();
}

impl Authority {
    pub fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for these addresses and DNS names.
    pub fn serving(&self, ips: &[IpAddr], dns: &[&str]) -> Result<Pem> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kube-apiserver");
        params.distinguished_name = dn;
        params.subject_alt_names = ips
            .iter()
            .map(|ip| SanType::IpAddress(*ip))
            .chain(
                dns.iter()
                    .map(|d| (*d).try_into().map(SanType::DnsName))
                    .collect::<Result<Vec<_>, _>>()?,
            )
            .collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// A client certificate: the API server takes its CN as the user and its O entries as
    /// the groups.
    pub fn client(&self, identity: &Identity) -> Result<Pem> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity.user.as_str());
        for group in &identity.groups {
            dn.push(DnType::OrganizationName, group.as_str());
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The key pair ServiceAccount tokens are signed (private, PKCS#8) and checked (public,
/// PKIX) with.
pub fn token_signing_key() -> Result<Pem> {
    let key = KeyPair::generate()?;
    Ok(Pem {
        cert: key.public_key_pem(),
        key: key.serialize_pem(),
    })
}

/// Writes `text` to `dir/name`, readable by the owner only, and returns the path.
pub fn write_private(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let write = || -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        std::io::Write::write_all(&mut file, text.as_bytes())
    };
    write().map_err(|source| PkiError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_pem_and_name_their_identity() {
        let ca = Authority::new("testbed-ca").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let serving = ca
            .serving(&["127.0.0.1".parse().unwrap()], &["localhost"])
            .unwrap();
        assert!(serving.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(serving.key.starts_with("-----BEGIN PRIVATE KEY-----"));
        let client = ca
            .client(&Identity::new("system:kube-proxy", &["g1", "g2"]))
            .unwrap();
        assert!(client.cert.contains("BEGIN CERTIFICATE"));
        let signing = token_signing_key().unwrap();
        assert!(signing.cert.starts_with("-----BEGIN PUBLIC KEY-----"));
    }
}
