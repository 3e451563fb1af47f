//! The RabbitMQ broker's own behaviour without a broker: errors keep their cause, a URL
//! list names each node.

mod cause_tests {
    use std::time::Duration;

    use crate::queue::rabbit::RabbitBroker;
    use crate::queue::{QueueError, Topology};

    /// A failed AMQP operation keeps lapin's error, so callers can tell a refused connection
    /// from a closed channel instead of reading a flattened message, and says it once.
    #[tokio::test]
    async fn an_amqp_failure_keeps_its_cause() {
        let broker = RabbitBroker::new(
            "amqp://guest:guest@127.0.0.1:1/%2f",
            Topology::new("cause"),
            "aptix-cause-test",
        )
        .with_timeout(Duration::from_secs(2));
        let Err(e) = broker.connect().await else {
            panic!("nothing listens on port 1");
        };
        let QueueError::Amqp(inner) = &e else {
            panic!("not lapin's error: {e:?}");
        };
        assert!(
            matches!(inner.kind(), lapin::ErrorKind::IOError(_)),
            "{inner:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("message broker unavailable: {inner}")
        );
        assert!(std::error::Error::source(&e).is_none(), "said once");
    }
}

mod url_tests {
    use crate::queue::rabbit::node_urls;

    #[test]
    fn a_url_list_names_each_node_in_order() {
        assert_eq!(
            node_urls("amqp://u:p@h1:5672/%2f, amqp://u:p@h2:5673/%2f,"),
            ["amqp://u:p@h1:5672/%2f", "amqp://u:p@h2:5673/%2f"]
        );
        assert_eq!(node_urls("amqp://h/%2f"), ["amqp://h/%2f"]);
    }
}
