//! Unit tests of the attribution on synthetic timelines, one per rule.
