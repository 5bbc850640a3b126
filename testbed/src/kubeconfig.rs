// SPDX-License-Identifier: Apache-2.0
//! Kubeconfig files for the control plane's identities: the CA and the credentials inline,
//! so that one file is all a client (the agent, kubectl, upstream's components) needs.

use base64::Engine as _;

/// How a client proves who it is.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A client certificate and its key, PEM.
    Certificate { cert: String, key: String },
    /// A bearer token (a ServiceAccount's, from the TokenRequest API).
    Token(String),
}

/// A kubeconfig for `server` (an https URL), trusting `ca_pem`, as `user`.
pub fn render(server: &str, ca_pem: &str, user: &str, credentials: &Credentials) -> String {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let user_fields = match credentials {
        Credentials::Certificate { cert, key } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert),
            b64(key)
        ),
        Credentials::Token(token) => format!("    token: {token}\n"),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    certificate-authority-data: {ca}
contexts:
- name: {user}@testbed
  context:
    cluster: testbed
    user: {user}
current-context: {user}@testbed
users:
- name: {user}
  user:
{user_fields}preferences: {{}}
",
        ca = b64(ca_pem),
    )
}

#[cfg(test)]
mod tests {
    use kube::config::Kubeconfig;

    use super::*;

    #[test]
    fn kube_reads_both_kinds() {
        let cert = render(
            "https://127.0.0.1:6443",
            "CA",
            "admin",
            &Credentials::Certificate {
                cert: "C".into(),
                key: "K".into(),
            },
        );
        let parsed = Kubeconfig::from_yaml(&cert).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("admin@testbed"));
        let auth = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(auth.client_certificate_data.is_some());
        let token = render(
            "https://127.0.0.1:6443",
            "CA",
            "agent",
            &Credentials::Token("t0k3n".into()),
        );
        let parsed = Kubeconfig::from_yaml(&token).unwrap();
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert!(
            parsed.auth_infos[0]
                .auth_info
                .as_ref()
                .unwrap()
                .token
                .is_some()
        );
    }
}
