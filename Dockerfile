# The Stampede core. Built by docker-compose.yml; not buildable on the development
# machine (no Docker engine there), where scripts/stack.sh runs the same binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p stampede-core

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/stampede /usr/local/bin/stampede
USER nobody
EXPOSE 8081 9091
ENTRYPOINT ["stampede"]
CMD ["serve"]
