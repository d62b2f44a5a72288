//! DNS messages on the wire: the checks a query passes before it is a question, and the answer
//! fitted to its transport (truncated for UDP), plus the record helpers the guard reads answers
//! with.

use std::net::IpAddr;

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RData, Record},
};

use super::settings::Transport;

/// The UDP answer size when the client says nothing (RFC 1035).
const DEFAULT_UDP_PAYLOAD: usize = 512;
/// Largest UDP answer we send whatever the client offers (DNS flag day 2020).
const MAX_UDP_PAYLOAD: usize = 1232;

/// A query that is a DNS query: (its id, the message). `Err` holds what to send back instead:
/// nothing for what is not even a DNS header or is a response (never answered: no reflection
/// loops), else an error answer.
pub(super) fn read_query(query: &[u8]) -> Result<(u16, Message), Option<Vec<u8>>> {
    if query.len() < 12 {
        return Err(None);
    }
    let id = u16::from_be_bytes([query[0], query[1]]);
    let Ok(msg) = Message::from_vec(query) else {
        return Err(encode(&Message::error_msg(
            id,
            OpCode::Query,
            ResponseCode::FormErr,
        )));
    };
    if msg.metadata.message_type != MessageType::Query {
        return Err(None); // a response sent to us: never answer it (no reflection loops)
    }
    if msg.metadata.op_code != OpCode::Query {
        return Err(encode(&Message::error_msg(
            id,
            msg.metadata.op_code,
            ResponseCode::NotImp,
        )));
    }
    Ok((id, msg))
}

/// The error answer `rcode` to query `id`.
pub(super) fn error(id: u16, rcode: ResponseCode) -> Option<Vec<u8>> {
    encode(&Message::error_msg(id, OpCode::Query, rcode))
}

/// The answer being built to one question of `query`, and how it goes back.
pub(super) struct Answer<'q> {
    pub reply: Message,
    query: &'q Message,
    transport: Transport,
}

impl<'q> Answer<'q> {
    /// An empty answer to `question` of `query` (query `id`).
    pub fn to(id: u16, query: &'q Message, question: &Query, transport: Transport) -> Self {
        let mut reply = Message::response(id, OpCode::Query);
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.add_query(question.clone());
        Self {
            reply,
            query,
            transport,
        }
    }

    /// The answer with `rcode`, encoded (see [`finish`]).
    pub fn code(self, rcode: ResponseCode) -> Option<Vec<u8>> {
        finish(self.reply, rcode, self.query, self.transport)
    }
}

/// The address of an A or AAAA record.
pub(super) fn address(r: &Record) -> Option<IpAddr> {
    match &r.data {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        RData::AAAA(a) => Some(IpAddr::V6(a.0)),
        _ => None,
    }
}

/// Follow CNAMEs from `start` through `records`; the last name reached.
pub(super) fn chain_tail(records: &[Record], start: &Name) -> Name {
    let mut name = start.clone();
    for _ in 0..16 {
        let next = records.iter().find_map(|r| match &r.data {
            RData::CNAME(c) if r.name == name => Some(c.0.clone()),
            _ => None,
        });
        match next {
            Some(n) => name = n,
            None => break,
        }
    }
    name
}

/// Set the code, fit the answer to the transport (truncate for UDP), encode.
fn finish(
    mut reply: Message,
    rcode: ResponseCode,
    query: &Message,
    transport: Transport,
) -> Option<Vec<u8>> {
    reply.metadata.response_code = rcode;
    let bytes = reply.to_vec().ok()?;
    if transport == Transport::Udp {
        let limit = query.edns.as_ref().map_or(DEFAULT_UDP_PAYLOAD, |e| {
            usize::from(e.max_payload()).clamp(DEFAULT_UDP_PAYLOAD, MAX_UDP_PAYLOAD)
        });
        if bytes.len() > limit {
            let mut small = Message::response(reply.metadata.id, OpCode::Query);
            small.metadata = reply.metadata;
            small.metadata.truncation = true;
            small.add_queries(reply.queries.iter().cloned());
            return small.to_vec().ok();
        }
    }
    Some(bytes)
}

fn encode(m: &Message) -> Option<Vec<u8>> {
    m.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::MessageType;

    use super::*;

    fn query() -> Message {
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("allowed.example.test.").expect("name"),
            hickory_proto::rr::RecordType::A,
        ));
        q
    }

    fn rcode(answer: &[u8]) -> ResponseCode {
        Message::from_vec(answer)
            .expect("an answer")
            .metadata
            .response_code
    }

    #[test]
    fn what_is_not_a_query_gets_no_answer_or_an_error() {
        assert_eq!(read_query(&[0; 11]), Err(None), "shorter than a header");
        let garbage = [0x12, 0x34, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff];
        let Err(Some(formerr)) = read_query(&garbage) else {
            panic!("garbage with a header is answered FORMERR");
        };
        assert_eq!(rcode(&formerr), ResponseCode::FormErr);
        let mut response = query();
        response.metadata.message_type = MessageType::Response;
        let bytes = response.to_vec().expect("encode");
        assert_eq!(
            read_query(&bytes),
            Err(None),
            "a response is never answered"
        );
        let mut update = query();
        update.metadata.op_code = OpCode::Update;
        let bytes = update.to_vec().expect("encode");
        let Err(Some(notimp)) = read_query(&bytes) else {
            panic!("another opcode is answered NOTIMP");
        };
        assert_eq!(rcode(&notimp), ResponseCode::NotImp);
    }

    #[test]
    fn a_query_is_read_with_its_id() {
        let q = query();
        let bytes = q.to_vec().expect("encode");
        let (id, msg) = read_query(&bytes).expect("a query");
        assert_eq!(id, q.metadata.id);
        assert_eq!(msg.queries, q.queries);
    }

    #[test]
    fn a_udp_answer_past_the_clients_size_is_truncated() {
        let q = query();
        let question = q.queries[0].clone();
        let mut answer = Answer::to(q.metadata.id, &q, &question, Transport::Udp);
        let record = Record::from_rdata(
            question.name().clone(),
            60,
            RData::A(hickory_proto::rr::rdata::A::new(192, 0, 2, 1)),
        );
        answer.reply.add_answers(vec![record; 64]);
        let bytes = answer.code(ResponseCode::NoError).expect("encoded");
        let got = Message::from_vec(&bytes).expect("parse");
        assert!(bytes.len() <= DEFAULT_UDP_PAYLOAD);
        assert!(got.metadata.truncation);
        assert!(got.answers.is_empty());
        assert_eq!(got.queries, q.queries);
    }
}
