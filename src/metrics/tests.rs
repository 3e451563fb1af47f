use super::*;

#[test]
fn a_route_template_is_named_once_however_many_answers_it_has() {
    let m = Metrics::new();
    for status in [200, 200, 404] {
        m.http_answered("/v1/turns", "POST", status, Duration::from_millis(3));
    }
    m.http_answered(UNMATCHED_ROUTE, "BREW", 404, Duration::from_millis(1));
    let a = m.route_name("/v1/turns");
    assert!(Arc::ptr_eq(&a, &m.route_name("/v1/turns")));
    assert_eq!(m.routes.read().unwrap().len(), 2);
    let text = m.encode();
    for line in [
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"200\"} 2",
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"404\"} 1",
        "aptix_http_requests_total{route=\"unmatched\",method=\"other\",status=\"404\"} 1",
        "aptix_http_request_duration_seconds_count{route=\"/v1/turns\"} 3",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[test]
fn exposition_names_every_family_with_labels() {
    let m = Metrics::new();
    m.turn_finished("completed");
    m.turn_finished("failed");
    m.turn_finished("failed");
    // A status outside the four a turn settles with still counts, under its own label.
    m.turn_finished("running");
    m.add_tokens([10, 3, 4, 1]);
    m.job_retry("transient");
    m.duplicate_suppressed("worker");
    m.observe_queue_wait(Duration::from_millis(20));
    m.sync_fenced(4);
    m.sync_fenced(2);
    let guard = m.run_started();
    let text = m.encode();
    drop(guard);
    assert!(
        text.contains("aptix_turns_total{status=\"completed\"} 1"),
        "{text}"
    );
    assert!(text.contains("aptix_turns_total{status=\"failed\"} 2"));
    assert!(text.contains("aptix_turns_total{status=\"cancelled\"} 0"));
    assert!(text.contains("aptix_turns_total{status=\"running\"} 1"));
    assert!(text.contains("aptix_model_tokens_total{kind=\"input\"} 10"));
    assert!(text.contains("aptix_model_tokens_total{kind=\"output\"} 3"));
    assert!(text.contains("aptix_model_tokens_total{kind=\"cached_input\"} 4"));
    assert!(text.contains("aptix_model_tokens_total{kind=\"reasoning\"} 1"));
    assert!(text.contains("aptix_job_retries_total{reason=\"transient\"} 1"));
    assert!(text.contains("aptix_duplicates_suppressed_total{stage=\"worker\"} 1"));
    assert!(text.contains("aptix_turn_queue_wait_seconds_count 1"));
    assert!(text.contains("aptix_turns_in_flight 1"));
    assert!(text.contains("aptix_fenced_writes_rejected_total 4"));
    assert!(m.encode().contains("aptix_turns_in_flight 0"));
}

#[test]
fn http_answers_are_counted_by_route_method_and_status_with_bounded_labels() {
    let m = Metrics::new();
    m.http_answered("/v1/turns", "POST", 202, Duration::from_millis(3));
    m.http_answered("/v1/turns", "POST", 202, Duration::from_millis(4));
    m.http_answered("/v1/turns", "POST", 400, Duration::from_micros(200));
    m.http_answered(UNMATCHED_ROUTE, "BREW", 404, Duration::from_micros(50));
    let text = m.encode();
    for line in [
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"202\"} 2",
        "aptix_http_requests_total{route=\"/v1/turns\",method=\"POST\",status=\"400\"} 1",
        "aptix_http_requests_total{route=\"unmatched\",method=\"other\",status=\"404\"} 1",
        "aptix_http_request_duration_seconds_count{route=\"/v1/turns\"} 3",
        // 0.2 ms is in the first bucket (1 ms), 3 and 4 ms in the 4 ms one.
        "aptix_http_request_duration_seconds_bucket{le=\"0.001\",route=\"/v1/turns\"} 1",
        "aptix_http_request_duration_seconds_bucket{le=\"0.004\",route=\"/v1/turns\"} 3",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert!(
        !text.contains("BREW"),
        "a method outside the standard ones is `other`"
    );
}
