//! Kubernetes Events for what the controller does to objects users look at: a `Network` or
//! `IPGroup` refused or ready again (a conflict, an invalid spec, a deletion held while its
//! network is in use), a port released because its pod went. `kubectl describe` and
//! `kubectl get events` show them on the object they concern.
//!
//! Published by one task through kube-runtime's `Recorder` (which folds repeats into a
//! series), one bounded call at a time from a bounded queue: a burst (a namespace deleted,
//! a thousand ports released) neither floods the apiserver nor holds the controller; what
//! does not fit is dropped and counted.

use super::{CALL_TIMEOUT, Status};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;

/// Events waiting to be published, at most.
const QUEUE: usize = 1024;

/// Where the controller sends its events.
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<(Event, ObjectReference)>,
    status: Arc<Status>,
}

impl Events {
    /// The queue, and the task that publishes from it as `identity` of knitter-manager
    /// (it ends when every `Events` is dropped).
    pub fn start(client: kube::Client, identity: &str, status: Arc<Status>) -> Events {
        let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter { controller: "knitter-manager".into(), instance: Some(identity.into()) },
        );
        let counters = status.clone();
        tokio::spawn(async move {
            while let Some((event, reference)) = rx.recv().await {
                match tokio::time::timeout(CALL_TIMEOUT, recorder.publish(&event, &reference)).await
                {
                    Ok(Ok(())) => {
                        counters.events.fetch_add(1, Relaxed);
                    }
                    Ok(Err(e)) => {
                        counters.events_failed.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, reason = %event.reason, "an event was not published");
                    }
                    Err(_) => {
                        counters.events_failed.fetch_add(1, Relaxed);
                    }
                }
            }
        });
        Events { tx, status }
    }

    fn send(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // The API's limit on a note is 1 kB.
        let note = if note.len() > 1000 {
            format!("{}…", &note[..note.floor_char_boundary(997)])
        } else {
            note
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if self.tx.try_send((event, reference)).is_err() {
            self.status.events_failed.fetch_add(1, Relaxed);
        }
    }

    /// A `Network` or `IPGroup` whose `Ready` condition changed: a warning with the
    /// refusal's reason, or `Ready` again.
    pub fn readiness(&self, reference: ObjectReference, ready: bool, reason: &str, message: &str) {
        if ready {
            self.send(reference, EventType::Normal, "Ready", "Apply", message.to_string());
        } else {
            self.send(reference, EventType::Warning, reason, "Apply", message.to_string());
        }
    }

    /// A port released because its pod went, on that pod.
    pub fn port_released(&self, pod: &str, uid: &str, what: String) {
        let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod));
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            ..Default::default()
        };
        self.send(reference, EventType::Normal, "PortReleased", "Release", what);
    }
}
