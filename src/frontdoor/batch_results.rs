//! Reading a batch back: its progress, and its result lines in submission order.

use super::FrontDoor;
use super::batch::{BatchProgress, BatchResultLine};
use crate::contract::InvokeResult;
use crate::store::{BatchItem, BatchRecord, StoreError};

impl FrontDoor {
    /// Counts the batch's turns by status.
    pub async fn batch_progress(&self, batch: &BatchRecord) -> Result<BatchProgress, StoreError> {
        crate::store::batch_progress(self.store.as_ref(), batch).await
    }

    /// The batch's result lines, in submission order, read a chunk of turns at a time.
    pub fn batch_results(
        &self,
        batch: BatchRecord,
    ) -> impl futures_util::Stream<Item = Result<Vec<BatchResultLine>, StoreError>> + Send + 'static
    {
        let store = self.store.clone();
        let rejected: Vec<BatchResultLine> = batch
            .rejected
            .into_iter()
            .map(|r| BatchResultLine {
                custom_id: r.custom_id,
                line: r.line,
                session_id: None,
                turn_id: None,
                status: "rejected".to_string(),
                result: InvokeResult::failures(r.errors),
            })
            .collect();
        let mut chunks: Vec<Vec<BatchItem>> = batch
            .items
            .chunks(crate::store::BATCH_READ_CHUNK)
            .map(<[BatchItem]>::to_vec)
            .collect();
        chunks.reverse();
        futures_util::stream::unfold(
            (store, chunks, Some(rejected)),
            |(store, mut chunks, mut rejected)| async move {
                let Some(chunk) = chunks.pop() else {
                    // Rejected lines come last, once: they have no turn to read.
                    let lines = rejected.take().filter(|r| !r.is_empty())?;
                    return Some((Ok(lines), (store, chunks, rejected)));
                };
                let ids: Vec<_> = chunk
                    .iter()
                    .map(|i| (i.session_id.clone(), i.turn_id.clone()))
                    .collect();
                let records = match store.get_turns(&ids).await {
                    Ok(r) => r,
                    Err(e) => return Some((Err(e), (store, Vec::new(), None))),
                };
                let lines = chunk
                    .into_iter()
                    .zip(records)
                    .map(|(item, record)| {
                        let (status, result) = match record {
                            None => ("expired", None),
                            Some(r) => {
                                let settled = r.status.is_settled();
                                (
                                    r.status.as_str(),
                                    if settled { r.result.map(|r| *r) } else { None },
                                )
                            }
                        };
                        BatchResultLine {
                            custom_id: Some(item.custom_id),
                            line: item.line,
                            session_id: Some(item.session_id),
                            turn_id: Some(item.turn_id),
                            status: status.to_string(),
                            result,
                        }
                    })
                    .collect();
                Some((Ok(lines), (store, chunks, rejected)))
            },
        )
    }
}
