//! The OpenAI-compatible embeddings client: one attempt, one POST of a
//! batch of texts to `{base_url}/embeddings` through the shared plumbing of
//! `http.rs`, answered with one vector per input. An answer is used whole
//! or not at all: a missing or repeated index, a count that differs from
//! the inputs', a vector of another length than the generation's, or one
//! with NaN, an infinity or no length is a `malformed_response`, and none
//! of its vectors is kept. Vectors come back normalised to unit length.

use serde::{Deserialize, Serialize};

use super::ProviderError;
use super::http::{Call, Failed, Http, HttpError};
use crate::config::EmbeddingConfig;
use crate::failure::redact;
use crate::model::Generation;
use crate::text::hex;

pub const NAME: &str = "openai";

/// Bytes of JSON one number of a vector may take in an answer (`-0.0123456789012345,`
/// is 20), and the room for the rest of the body: what bounds a response.
const BYTES_PER_NUMBER: usize = 32;
const BODY_MARGIN: usize = 64 * 1024;
/// The length assumed for the bound when the model's own is not known yet.
const ASSUMED_DIMENSIONS: usize = 4096;

pub struct Embedder {
    http: Http,
    /// `embedding.base_url`, credentials redacted.
    base_url: String,
    endpoint: String,
    model: String,
    /// The model name queries are embedded with (`embedding.query_model`,
    /// else `model`).
    query_model: String,
    key_env: String,
    /// Asked for (0: the model's own).
    dimensions: u32,
    batch: u32,
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<u32>,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<Datum>,
}

#[derive(Deserialize)]
struct Datum {
    embedding: Vec<f64>,
    index: usize,
}

impl Embedder {
    /// `api_key` is the value of the variable `api_key_env` names, if set.
    pub fn new(
        config: &EmbeddingConfig,
        api_key: Option<String>,
    ) -> Result<Embedder, reqwest::Error> {
        let dims = match config.dimensions {
            0 => ASSUMED_DIMENSIONS,
            n => n as usize,
        };
        let bound = (config.batch as usize)
            .saturating_mul(dims)
            .saturating_mul(BYTES_PER_NUMBER)
            .saturating_add(BODY_MARGIN);
        let http = Http::new(
            api_key,
            bound,
            "what embedding.batch and embedding.dimensions allow",
        )?;
        let base_url = config.base_url.trim_end_matches('/');
        Ok(Embedder {
            http,
            base_url: redact(base_url, &[]),
            endpoint: format!("{base_url}/embeddings"),
            model: config.model.clone(),
            query_model: match config.query_model.as_str() {
                "" => config.model.clone(),
                name => name.to_owned(),
            },
            key_env: config.api_key_env.clone(),
            dimensions: config.dimensions,
            batch: config.batch,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The model name queries are embedded with.
    pub fn query_model(&self) -> &str {
        &self.query_model
    }

    /// The base URL, credentials redacted.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The URL requests go to, credentials redacted.
    pub fn endpoint(&self) -> String {
        format!("{}/embeddings", self.base_url)
    }

    /// The name of the variable the key is read from.
    pub fn key_env(&self) -> &str {
        &self.key_env
    }

    /// Inputs per request.
    pub fn batch(&self) -> u32 {
        self.batch
    }

    /// Which vectors this embedder makes: model and dimensions. Vectors of
    /// one generation compare; of two, never.
    pub fn generation(&self) -> Generation {
        Generation::new(&self.model, self.dimensions)
    }

    /// A hash of kind, endpoint, model, dimensions and key: equal for equal
    /// configurations, and showing nothing of the key. A batch parked under
    /// one is due again under another.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(
            format!(
                "{NAME}-embeddings\n{}\n{}\n{}\n{}",
                self.endpoint,
                self.model,
                self.dimensions,
                self.http.key_identity()
            )
            .as_bytes(),
        );
        format!("{NAME}-embeddings:{}", &hex(&digest)[..16])
    }

    /// What must never appear in a cause, a log line or the store.
    pub fn secrets(&self) -> Vec<&str> {
        self.http.secrets()
    }

    /// One attempt: a unit vector per text, in order, each `expected` long
    /// when that is known (the generation's length, else the first
    /// vector's). The caller bounds it in time.
    pub async fn embed(
        &self,
        texts: &[&str],
        expected: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, ProviderError> {
        self.send(&self.model, texts, expected)
            .await
            .map_err(|f| self.http.error(NAME, f))
    }

    /// As `embed`, for a search's query: under the query model name (for
    /// models with a query input type, such as e5's), of the same
    /// generation.
    pub async fn embed_query(
        &self,
        query: &str,
        expected: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, ProviderError> {
        self.send(&self.query_model, &[query], expected)
            .await
            .map_err(|f| self.http.error(NAME, f))
    }

    async fn send(
        &self,
        model: &str,
        texts: &[&str],
        expected: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, Failed> {
        let body = EmbeddingsRequest {
            model,
            input: texts,
            dimensions: (self.dimensions > 0).then_some(self.dimensions),
        };
        let answer = self
            .http
            .post(Call::Embeddings, &self.endpoint, &body)
            .await?;
        let parsed: EmbeddingsResponse = answer.json(Call::Embeddings, &self.secrets())?;
        let expected = expected.or((self.dimensions > 0).then_some(self.dimensions as usize));
        vectors(parsed.data, texts.len(), expected)
            .map_err(|why| Failed::malformed(HttpError::Vectors(why), answer.status, None))
    }
}

/// The answer's vectors in input order, normalised, or why it cannot be
/// used.
fn vectors(
    data: Vec<Datum>,
    inputs: usize,
    expected: Option<usize>,
) -> Result<Vec<Vec<f32>>, String> {
    if data.len() != inputs {
        return Err(format!("{} vectors for {inputs} inputs", data.len()));
    }
    let mut out: Vec<Option<Vec<f32>>> = vec![None; inputs];
    let mut length = expected;
    for d in data {
        let Some(slot) = out.get_mut(d.index) else {
            return Err(format!("index {} for {inputs} inputs", d.index));
        };
        if slot.is_some() {
            return Err(format!("index {} given twice", d.index));
        }
        let want = *length.get_or_insert(d.embedding.len());
        if d.embedding.len() != want {
            return Err(format!(
                "vector {} has {} dimensions where {want} are due",
                d.index,
                d.embedding.len()
            ));
        }
        *slot =
            Some(normalised(&d.embedding).ok_or_else(|| {
                format!("vector {} has a NaN, an infinity or no length", d.index)
            })?);
    }
    // Every index is present: the count matched and none repeated.
    Ok(out.into_iter().flatten().collect())
}

/// `v` scaled to unit length as f32; None when it has a number that is not
/// finite, or no length to scale.
pub(crate) fn normalised(v: &[f64]) -> Option<Vec<f32>> {
    if v.is_empty() || !v.iter().all(|x| x.is_finite()) {
        return None;
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if !(norm.is_finite() && norm > 0.0) {
        return None;
    }
    let unit: Vec<f32> = v.iter().map(|x| (x / norm) as f32).collect();
    unit.iter().all(|x| x.is_finite()).then_some(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datum(index: usize, embedding: Vec<f64>) -> Datum {
        Datum { embedding, index }
    }

    #[test]
    fn vectors_come_back_in_input_order_at_unit_length() {
        let got = vectors(
            vec![datum(1, vec![0.0, 2.0]), datum(0, vec![3.0, 4.0])],
            2,
            None,
        )
        .expect("usable");
        assert_eq!(got, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
    }

    #[test]
    fn an_answer_that_cannot_be_stored_whole_is_refused() {
        let two = || vec![datum(0, vec![1.0, 0.0]), datum(1, vec![0.0, 1.0])];
        assert!(
            vectors(two(), 3, None)
                .unwrap_err()
                .contains("2 vectors for 3")
        );
        assert!(
            vectors(two(), 2, Some(3))
                .unwrap_err()
                .contains("dimensions")
        );
        let mixed = vec![datum(0, vec![1.0, 0.0]), datum(1, vec![1.0])];
        assert!(vectors(mixed, 2, None).unwrap_err().contains("dimensions"));
        let repeated = vec![datum(0, vec![1.0]), datum(0, vec![1.0])];
        assert!(vectors(repeated, 2, None).unwrap_err().contains("twice"));
        let out_of_range = vec![datum(0, vec![1.0]), datum(2, vec![1.0])];
        assert!(
            vectors(out_of_range, 2, None)
                .unwrap_err()
                .contains("index 2")
        );
        for bad in [f64::NAN, f64::INFINITY] {
            let v = vec![datum(0, vec![1.0, bad])];
            assert!(vectors(v, 1, None).unwrap_err().contains("NaN"));
        }
        assert!(vectors(vec![datum(0, vec![0.0, 0.0])], 1, None).is_err());
        assert!(vectors(vec![datum(0, vec![1e300, 1e300])], 1, None).is_err());
    }
}
