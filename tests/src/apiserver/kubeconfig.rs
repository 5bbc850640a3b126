// SPDX-License-Identifier: Apache-2.0
//! A kubeconfig pointing at the test server over plain HTTP, without credentials.

/// The context, cluster and user name written into the kubeconfig.
pub const CONTEXT_NAME: &str = "test-apiserver";

pub fn render(server_url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT_NAME}
  cluster:
    server: {server_url}
contexts:
- name: {CONTEXT_NAME}
  context:
    cluster: {CONTEXT_NAME}
    user: {CONTEXT_NAME}
    namespace: default
current-context: {CONTEXT_NAME}
users:
- name: {CONTEXT_NAME}
  user: {{}}
preferences: {{}}
"
    )
}

#[cfg(test)]
mod tests {
    use kube::config::Kubeconfig;

    use super::*;

    #[test]
    fn kube_parses_the_rendered_kubeconfig() {
        let config = Kubeconfig::from_yaml(&render("http://127.0.0.1:1234")).unwrap();
        assert_eq!(config.current_context.as_deref(), Some(CONTEXT_NAME));
        let cluster = config.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:1234"));
    }
}
