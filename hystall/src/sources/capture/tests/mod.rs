//! Tests of the capture reader.
