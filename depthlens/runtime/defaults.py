"""The default eval set's size and bootstrap size, named once for every command, study and API function
(torch-free, so the CLI's option declarations can read them without loading torch)."""

DEFAULT_N_SEQ = 32  # eval sequences: enough for a paired interval of a few hundredths on the shipped models
DEFAULT_SEQ_LEN = 128  # the shipped reports' length: report, track, the API and every command share it
DEFAULT_N_BOOT = 1000  # bootstrap resamples over sequences for every headline share's interval
DEFAULT_CORPUS_BYTES = 4_000_000  # enough held-out text for the default eval set, quick to build on a CPU
