//! Which provider each kind of run (serve, backfill) last summarised with,
//! so that a run configured with another one can be told apart.

use super::Postgres;
use crate::model::{Millis, ProviderIdentity};
use crate::store::StoreError;

impl Postgres {
    pub(crate) async fn provider_identity(
        &self,
        role: &str,
    ) -> Result<Option<ProviderIdentity>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT kind, base_url, model FROM provider_runs WHERE role = $1")
            .await?;
        Ok(match client.query_opt(&stmt, &[&role]).await? {
            Some(r) => Some(ProviderIdentity {
                kind: r.try_get(0)?,
                base_url: r.try_get(1)?,
                model: r.try_get(2)?,
            }),
            None => None,
        })
    }

    pub(crate) async fn record_provider_identity(
        &self,
        role: &str,
        identity: &ProviderIdentity,
    ) -> Result<(), StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO provider_runs (role, kind, base_url, model, recorded_at) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (role) DO UPDATE SET kind = $2, base_url = $3, model = $4, \
                 recorded_at = $5",
            )
            .await?;
        let result = client
            .execute(
                &stmt,
                &[
                    &role,
                    &identity.kind,
                    &identity.base_url,
                    &identity.model,
                    &Millis::now().0,
                ],
            )
            .await;
        self.noting_full(result.map_err(StoreError::from))?;
        Ok(())
    }
}
