"""SWE-bench: rows -> tasks (:mod:`.rows`), the harness's grading (:mod:`.grading`, :mod:`.parity`), which
tests need the network (:mod:`.network`), and environments prepared for the local sandbox
(:mod:`.prepare`, :mod:`.submodules`)."""
