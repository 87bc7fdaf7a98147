# The Stampede core, and the payment simulator tool. Built by docker-compose.yml; not
# buildable on the development machine (no Docker engine there), where scripts/stack.sh
# runs the same binaries.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p stampede-core -p stampede-paysim

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/stampede /usr/local/bin/stampede
# The payment provider simulator, for the compose file's off-by-default `demo` profile.
COPY --from=build /src/target/release/stampede-paysim /usr/local/bin/stampede-paysim
USER nobody
EXPOSE 8081 9091
ENTRYPOINT ["stampede"]
CMD ["serve"]
