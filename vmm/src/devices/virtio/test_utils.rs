//! Test helpers: guest memory, and driving a queue the way a driver does.
