//! Tenant authentication: bearer tokens configured per tenant, each kept
//! only as its SHA-256, compared in constant time, never logged. With no
//! tenant configured the server runs open, and every caller is the default
//! tenant.

use sha2::{Digest, Sha256};

use crate::config::TenantConfig;
use crate::model::Tenant;

/// Who may call, by the digest of their token.
#[derive(Clone)]
pub struct Auth {
    tenants: Vec<(Tenant, [u8; 32])>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error(
        "this server needs a bearer token: the archivist terminal client takes --token (or ARCHIVIST_TOKEN); other clients send the header `authorization: Bearer <token>`"
    )]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error(
        "auth.tenants[{index}] ({name}): the variable {var} named by token_env is not set or empty"
    )]
    TokenEnvUnset {
        index: usize,
        name: String,
        var: String,
    },
    #[error("auth.tenants[{index}] ({name}): token_sha256 is not 64 hex digits")]
    BadDigest { index: usize, name: String },
    #[error(
        "auth.tenants[{index}] ({name}) has the same token as {other}: each tenant needs its own"
    )]
    SharedToken {
        index: usize,
        name: String,
        other: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Digests are not secrets, but there is no reason to print them.
        f.debug_struct("Auth")
            .field("tenants", &self.tenants.len())
            .finish()
    }
}

impl Auth {
    /// Builds the table from the configuration, reading `token_env`
    /// variables through `env`.
    pub fn from_config(
        tenants: &[TenantConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Auth, AuthSetupError> {
        let mut table: Vec<(Tenant, [u8; 32])> = Vec::with_capacity(tenants.len());
        for (index, t) in tenants.iter().enumerate() {
            let digest = match (&t.token_sha256, &t.token_env) {
                (Some(hex), _) => parse_hex(hex).ok_or_else(|| AuthSetupError::BadDigest {
                    index,
                    name: t.name.clone(),
                })?,
                (None, Some(var)) => {
                    let token = env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        AuthSetupError::TokenEnvUnset {
                            index,
                            name: t.name.clone(),
                            var: var.clone(),
                        }
                    })?;
                    Sha256::digest(token.as_bytes()).into()
                }
                // Refused by the configuration's validation already.
                (None, None) => {
                    return Err(AuthSetupError::BadDigest {
                        index,
                        name: t.name.clone(),
                    });
                }
            };
            // A token two tenants share would let one act as the other.
            if let Some((other, _)) = table.iter().find(|(_, d)| *d == digest) {
                return Err(AuthSetupError::SharedToken {
                    index,
                    name: t.name.clone(),
                    other: other.0.clone(),
                });
            }
            table.push((Tenant(t.name.clone()), digest));
        }
        Ok(Auth { tenants: table })
    }

    /// Open: no tenant is configured and no token is asked for.
    pub fn is_open(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant an `authorization` header value names.
    pub fn tenant(&self, authorization: Option<&str>) -> Result<Tenant, AuthError> {
        if self.is_open() {
            return Ok(Tenant::default());
        }
        let token = authorization
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Missing)?;
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Every tenant is compared, each in constant time, so the time taken
        // says nothing of which digest (or how much of one) matched.
        let mut found = None;
        for (tenant, digest) in &self.tenants {
            if constant_time_eq(&presented, digest) {
                found = Some(tenant.clone());
            }
        }
        found.ok_or(AuthError::Invalid)
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::token_sha256;

    fn tenants() -> Vec<TenantConfig> {
        vec![
            TenantConfig {
                name: "alpha".into(),
                token_sha256: Some(token_sha256("alpha-token")),
                token_env: None,
            },
            TenantConfig {
                name: "beta".into(),
                token_sha256: None,
                token_env: Some("BETA_TOKEN".into()),
            },
        ]
    }

    #[test]
    fn tokens_name_their_tenant() {
        let auth = Auth::from_config(&tenants(), |v| {
            (v == "BETA_TOKEN").then(|| "beta-token".into())
        })
        .expect("auth");
        assert_eq!(
            auth.tenant(Some("Bearer alpha-token")),
            Ok(Tenant("alpha".into()))
        );
        assert_eq!(
            auth.tenant(Some("Bearer beta-token")),
            Ok(Tenant("beta".into()))
        );
        assert_eq!(auth.tenant(Some("Bearer nope")), Err(AuthError::Invalid));
        assert_eq!(auth.tenant(Some("alpha-token")), Err(AuthError::Missing));
        assert_eq!(auth.tenant(None), Err(AuthError::Missing));
        assert_eq!(auth.tenant(Some("Bearer ")), Err(AuthError::Missing));
    }

    #[test]
    fn an_unset_token_variable_is_refused_by_name() {
        let e = Auth::from_config(&tenants(), |_| None).expect_err("unset");
        assert!(e.to_string().contains("BETA_TOKEN"), "{e}");
    }

    #[test]
    fn two_tenants_cannot_share_a_token() {
        let mut t = tenants();
        t[1] = TenantConfig {
            name: "beta".into(),
            token_sha256: Some(token_sha256("alpha-token")),
            token_env: None,
        };
        let e = Auth::from_config(&t, |_| None).expect_err("shared");
        assert!(e.to_string().contains("alpha"), "{e}");
    }

    #[test]
    fn open_mode_takes_everyone_as_the_default_tenant() {
        let auth = Auth::from_config(&[], |_| None).expect("auth");
        assert!(auth.is_open());
        assert_eq!(auth.tenant(None), Ok(Tenant::default()));
    }
}
