//! Which provider each kind of run (serve, backfill) last summarised with,
//! so that a run configured with another one can be told apart.

use rusqlite::{OptionalExtension, params};

use super::Sqlite;
use crate::model::{Millis, ProviderIdentity};
use crate::store::StoreError;

impl Sqlite {
    pub(crate) async fn provider_identity(
        &self,
        role: &str,
    ) -> Result<Option<ProviderIdentity>, StoreError> {
        let role = role.to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT kind, base_url, model FROM provider_runs WHERE role = ?1")?
                .query_row([role], |r| {
                    Ok(ProviderIdentity {
                        kind: r.get(0)?,
                        base_url: r.get(1)?,
                        model: r.get(2)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    pub(crate) async fn record_provider_identity(
        &self,
        role: &str,
        identity: &ProviderIdentity,
    ) -> Result<(), StoreError> {
        let role = role.to_owned();
        let identity = identity.clone();
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO provider_runs (role, kind, base_url, model, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (role) DO UPDATE SET kind = ?2, base_url = ?3, model = ?4, \
                 recorded_at = ?5",
            )?
            .execute(params![
                role,
                identity.kind,
                identity.base_url,
                identity.model,
                Millis::now().0
            ])?;
            Ok(())
        })
        .await
    }
}
