"""Speculative decoding: proposers guess a request's next tokens on the host (n-gram prompt lookup, a draft
model), the target model checks them in one forward pass of the normal continuous batch (engine/runner/
speculative.py with engine/layers/rejection_sampler.py) and the engine core keeps the accepted prefix
(engine/spec/decoder.py). ``--speculative-config`` (engine/spec/config.py) turns it on."""
