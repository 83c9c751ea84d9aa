//! Reads the Secrets a `RedisQuorum` names. Read on every health check rather than watched: the operator then
//! needs `get` on Secrets only, not a cache of every Secret; a rotated password is picked up within one health
//! interval.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::config::QuorumSecrets;
use crate::api::RedisQuorum;
use crate::controller::context::Context;
use crate::controller::engines::problem::QuorumProblem;

pub async fn read_secrets(quorum: &RedisQuorum, ctx: &Context) -> Result<QuorumSecrets, QuorumProblem> {
    let mut secrets = QuorumSecrets::default();
    if let Some(auth) = &quorum.spec.auth {
        let secret = get_secret(ctx, &auth.secret_namespace, &auth.secret_name).await?;
        let text = |key: &str| secret_text(&secret, &auth.secret_namespace, &auth.secret_name, key);
        secrets.password = Some(text(&auth.password_key)?);
        if let Some(key) = &auth.username_key {
            secrets.username = Some(text(key)?);
        }
    }
    if let Some(tls) = &quorum.spec.tls {
        match (&tls.ca_secret_namespace, &tls.ca_secret_name) {
            (Some(namespace), Some(name)) => {
                let secret = get_secret(ctx, namespace, name).await?;
                secrets.ca_pem = Some(secret_text(&secret, namespace, name, &tls.ca_key)?.into_bytes());
            }
            (None, None) => {}
            _ => {
                return Err(QuorumProblem::InvalidSpec(
                    "spec.tls needs both caSecretNamespace and caSecretName, or neither".to_owned(),
                ));
            }
        }
    }
    Ok(secrets)
}

async fn get_secret(ctx: &Context, namespace: &str, name: &str) -> Result<Secret, QuorumProblem> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    match api.get_opt(&name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(QuorumProblem::SecretNotFound { namespace, name }),
        Err(kube::Error::Api(status)) if status.is_forbidden() => Err(QuorumProblem::SecretForbidden {
            namespace,
            name,
            message: status.message.clone(),
        }),
        Err(err) => Err(QuorumProblem::SecretUnreadable {
            namespace,
            name,
            message: err.to_string(),
        }),
    }
}

fn secret_text(secret: &Secret, namespace: &str, name: &str, key: &str) -> Result<String, QuorumProblem> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|value| value.clone().into_bytes())
        })
        .ok_or_else(|| QuorumProblem::SecretKeyMissing {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        })?;
    String::from_utf8(bytes).map_err(|_| QuorumProblem::SecretKeyInvalid {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
    })
}
