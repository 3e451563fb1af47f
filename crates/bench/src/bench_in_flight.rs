//! How many turns each process held at once: the front door's synchronous calls and
//! long-polls waiting (`aptix_http_requests_in_flight`, its own `/metrics` scrape left out)
//! and the worker's turns (`aptix_turns_in_flight`), read from their `/metrics` while the
//! turns run and kept at their highest. The heap a turn in flight holds is a process's peak
//! over what it held before, divided by this, not by the turns started: with a short model,
//! the first turns end before the last ones start, and dividing by every turn started would
//! understate it. Read only in a run for memory (turns that wait on the model): the reads are
//! work of the processes', which a run for CPU or allocations per turn should not count.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The most each process held at once while the turns ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    /// The front door's calls in flight (synchronous waits and long-polls).
    pub serve: u64,
    /// The worker's turns in flight.
    pub worker: u64,
}

/// The sum of the samples named `name` (with any labels but those that contain `leave_out`)
/// in a text exposition; `None` when there is none.
pub(crate) fn gauge_sum(text: &str, name: &str, leave_out: Option<&str>) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(labelled) => match labelled.split_once("} ") {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue, // another metric whose name starts with this one
            },
        };
        if leave_out.is_some_and(|l| labels.contains(l)) {
            continue;
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            *found.get_or_insert(0) += v.max(0.0) as u64;
        }
    }
    found
}

/// One reading of both processes (a process that cannot be read counts 0 for it).
async fn read_once(client: &reqwest::Client, serve: &str, worker: &str) -> Peaks {
    let text = |address: String| async move {
        let response = client.get(address).send().await.ok()?;
        response.text().await.ok()
    };
    let (s, w) = tokio::join!(
        text(format!("http://{serve}/metrics")),
        text(format!("http://{worker}/metrics")),
    );
    Peaks {
        serve: s
            .and_then(|t| gauge_sum(&t, "aptix_http_requests_in_flight", Some("/metrics")))
            .unwrap_or(0),
        worker: w
            .and_then(|t| gauge_sum(&t, "aptix_turns_in_flight", None))
            .unwrap_or(0),
    }
}

/// Reads both processes every `every` until `stop`, and answers the highest each showed.
pub async fn watch(
    client: reqwest::Client,
    serve: String,
    worker: String,
    every: Duration,
    stop: CancellationToken,
) -> Peaks {
    let mut peaks = Peaks::default();
    loop {
        let now = read_once(&client, &serve, &worker).await;
        peaks.serve = peaks.serve.max(now.serve);
        peaks.worker = peaks.worker.max(now.worker);
        tokio::select! {
            () = stop.cancelled() => return peaks,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_samples_of_a_gauge_are_summed_and_the_scrape_itself_left_out() {
        let text = "# TYPE aptix_http_requests_in_flight gauge\n\
            aptix_http_requests_in_flight{route=\"/api/ai/agent/execute\"} 1200\n\
            aptix_http_requests_in_flight{route=\"/api/sessions/{id}/turns/{turn}\"} 30\n\
            aptix_http_requests_in_flight{route=\"/metrics\"} 1\n\
            aptix_http_requests_in_flight_other 99\n\
            aptix_turns_in_flight 1745\n\
            # EOF\n";
        assert_eq!(
            gauge_sum(text, "aptix_http_requests_in_flight", Some("/metrics")),
            Some(1230)
        );
        assert_eq!(gauge_sum(text, "aptix_turns_in_flight", None), Some(1745));
        assert_eq!(gauge_sum(text, "aptix_model_calls_in_flight", None), None);
    }
}
